// host_memory_available: /proc/meminfo, then the cgroup hierarchy of this process (see the header).
#include "core/host_memory.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace cpfill {

namespace {

std::optional<std::string> read_text(const std::string& path) {
    std::ifstream f(path);
    if (!f) return std::nullopt;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The number after "key" at the start of a line of `text` ("key 123" or "key: 123 kB").
std::optional<size_t> keyed_value(const std::string& text, const std::string& key) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, key.size(), key) != 0) continue;
        std::istringstream rest(line.substr(key.size()));
        if (rest.peek() == ':') rest.get();
        unsigned long long v = 0;
        if (rest >> v) return static_cast<size_t>(v);
    }
    return std::nullopt;
}

std::optional<size_t> first_number(const std::string& text) {
    std::istringstream in(text);
    unsigned long long v = 0;
    if (in >> v) return static_cast<size_t>(v);
    return std::nullopt;
}

// The cgroup folders of this process, innermost first: v2 ("0::/a/b") or v1's memory controller.
std::vector<std::pair<std::string, bool>> cgroup_dirs() {
    std::vector<std::pair<std::string, bool>> dirs;  // (folder, is v2)
    const auto self = read_text("/proc/self/cgroup");
    if (!self) return dirs;
    std::istringstream in(*self);
    std::string line;
    while (std::getline(in, line)) {
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        std::string path = line.substr(b + 1);
        const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
        const bool v1_memory = (',' + controllers + ',').find(",memory,") != std::string::npos;
        if (!v2 && !v1_memory) continue;
        const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
        // Walk up to the root of the (possibly namespaced) hierarchy.
        while (true) {
            dirs.emplace_back(root + (path == "/" ? "" : path), v2);
            if (path.empty() || path == "/") break;
            const size_t slash = path.rfind('/');
            path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
        }
    }
    return dirs;
}

}  // namespace

std::optional<size_t> meminfo_available(const std::string& meminfo) {
    const auto kb = keyed_value(meminfo, "MemAvailable");
    if (!kb) return std::nullopt;
    return *kb * 1024;
}

std::optional<size_t> cgroup_headroom(const std::string& limit, const std::string& usage,
                                      const std::string& stat) {
    const auto lim = first_number(limit);  // "max" reads as no number: no limit
    if (!lim || *lim >= (size_t{1} << 60)) return std::nullopt;
    size_t used = first_number(usage).value_or(0);
    // Inactive file cache is reclaimed before the limit bites (v2 "inactive_file", v1
    // "total_inactive_file").
    const size_t cache = keyed_value(stat, "inactive_file")
                             .value_or(keyed_value(stat, "total_inactive_file").value_or(0));
    used = cache < used ? used - cache : 0;
    return used < *lim ? *lim - used : 0;
}

size_t parse_byte_size(const std::string& text, const std::string& what) {
    size_t pos = 0;
    double v = -1;
    try {
        v = std::stod(text, &pos);
    } catch (const std::exception&) {
        pos = 0;
    }
    std::string unit = text.substr(pos);
    if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
    if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
    double scale = 0;
    if (unit.empty())
        scale = 1;
    else if (unit.size() == 1) {
        const std::string units = "KMGT";
        const size_t k = units.find(static_cast<char>(std::toupper(unit[0])));
        if (k != std::string::npos) scale = std::pow(1024.0, double(k + 1));
    }
    CPFILL_CHECK(pos > 0 && scale > 0 && std::isfinite(v) && v >= 0 && v * scale < 1.8e19,
                 "{}: expected a byte count such as 68719476736, 64G or 1.5T, found \"{}\"", what,
                 text);
    return static_cast<size_t>(v * scale);
}

std::optional<HostMemory> host_memory_available() {
    if (const char* env = std::getenv("CPFILL_HOST_MEMORY"); env && *env)
        return HostMemory{parse_byte_size(env, "CPFILL_HOST_MEMORY"), "CPFILL_HOST_MEMORY"};
    std::optional<HostMemory> best;
    if (const auto text = read_text("/proc/meminfo"))
        if (const auto avail = meminfo_available(*text))
            best = HostMemory{*avail, "MemAvailable in /proc/meminfo"};
    for (const auto& [dir, v2] : cgroup_dirs()) {
        const auto limit = read_text(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
        if (!limit) continue;
        const auto usage = read_text(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
        const auto stat = read_text(dir + "/memory.stat");
        const auto room = cgroup_headroom(*limit, usage.value_or(""), stat.value_or(""));
        if (room && (!best || *room < best->available))
            best = HostMemory{*room, "the memory limit of cgroup " + dir};
    }
    return best;
}

}  // namespace cpfill
