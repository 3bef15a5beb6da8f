// How much host memory a run may still take, so that a load or a run that cannot fit is refused
// with the numbers before any work, instead of the kernel's out-of-memory killer ending the process
// halfway. The figure is the smaller of the system's MemAvailable (/proc/meminfo) and the headroom
// of every cgroup (v2 memory.max, or v1 memory.limit_in_bytes) on the way up from this process's
// own: limit − (usage − inactive file cache), as container runtimes count it. CPFILL_HOST_MEMORY
// (bytes, or a number with a K/M/G/T suffix in powers of 1024) replaces the detection.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace cpfill {

struct HostMemory {
    size_t available = 0;
    std::string source;  // where the figure comes from, for error messages
};

// The detected (or overridden) figure; nullopt when nothing can be read (not Linux): no check.
std::optional<HostMemory> host_memory_available();

// The parts of the detection, exposed for tests. `meminfo` is the text of /proc/meminfo; returns
// MemAvailable in bytes. `limit`, `usage` and `stat` are a cgroup's memory.max /
// memory.limit_in_bytes, memory.current / memory.usage_in_bytes and memory.stat texts; returns the
// headroom, or nullopt when the cgroup sets no limit ("max" or a value ≥ 2^60).
std::optional<size_t> meminfo_available(const std::string& meminfo);
std::optional<size_t> cgroup_headroom(const std::string& limit, const std::string& usage,
                                      const std::string& stat);
// "123", "64G", "1.5T": bytes. Throws cpfill::Error naming `what` for anything else.
size_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace cpfill
