// Whether the client of a request still waits for the answer (docs/serve.md "Disconnected
// clients"). cpp-httplib 0.11 gives a handler neither the socket nor a connection-closed query, so
// the server finds the request's socket among this process's descriptors by its two endpoints
// (Linux: /proc/self/fd) — the handler's thread holds it open while it waits — and asks the kernel
// whether the peer has closed it.
#pragma once

#include <string>

namespace cpfill::serve {

// The descriptor of the TCP connection local_port ↔ remote_addr:remote_port, or -1.
int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port);

// True when the peer closed the connection (or reset it): the client is gone.
bool peer_closed(int fd);

}  // namespace cpfill::serve
