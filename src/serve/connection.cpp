// Finding a request's socket and asking whether its peer hung up.
#include "serve/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

namespace cpfill::serve {

namespace {

// The address (numeric) and port of a socket address; false for non-IP families.
bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
        port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
        port = ntohs(in6->sin6_port);
    } else {
        return false;
    }
    host = buf;
    return true;
}

bool matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    sockaddr_storage local{}, peer{};
    socklen_t n = sizeof local, m = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0) return false;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &m) != 0) return false;
    std::string lhost, phost;
    int lport = -1, pport = -1;
    if (!address_of(local, lhost, lport) || !address_of(peer, phost, pport)) return false;
    return lport == local_port && pport == remote_port && phost == remote_addr;
}

}  // namespace

int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
        char* end = nullptr;
        const std::string name = e.path().filename().string();
        const long fd = std::strtol(name.c_str(), &end, 10);
        if (end == name.c_str() || *end != '\0') continue;
        if (matches(static_cast<int>(fd), remote_addr, remote_port, local_port))
            return static_cast<int>(fd);
    }
    return -1;
}

bool peer_closed(int fd) {
    if (fd < 0) return false;  // not found: assume the client waits
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    if (p.revents & POLLIN) {
        char c;
        return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;  // 0: orderly shutdown
    }
    return false;
}

}  // namespace cpfill::serve
