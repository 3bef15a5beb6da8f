// libFuzzer target for parse_safetensors_header. Input: 8 bytes little-endian data-area size, then
// the header text. The parser may only throw cpfill::Error; anything else (another exception, a
// sanitizer report, or an accepted header that breaks the invariants below) is a crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "io/safetensors.h"

namespace {

// Every accepted tensor lies inside the data area and holds exactly numel · size bytes; returns
// the end of the last one.
size_t check_accepted(const std::map<std::string, cpfill::TensorInfo>& infos, uint64_t data_size) {
    size_t max_end = 0;
    for (const auto& [name, info] : infos) {
        const uint64_t bytes =
            static_cast<uint64_t>(cpfill::shape_numel(info.shape)) * cpfill::dtype_size(info.dtype);
        if (info.name != name || info.begin > info.end || info.end > data_size ||
            info.end - info.begin != bytes)
            __builtin_trap();
        max_end = std::max(max_end, info.end);
    }
    return max_end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    uint64_t data_size = 0;
    for (int i = 7; i >= 0; --i) data_size = (data_size << 8) | data[i];
    const std::string text(reinterpret_cast<const char*>(data + 8), size - 8);
    size_t max_end = 0;
    try {
        std::map<std::string, std::string> metadata;
        max_end = check_accepted(cpfill::parse_safetensors_header(
                                     text, static_cast<size_t>(data_size), "fuzz", &metadata),
                                 data_size);
    } catch (const cpfill::Error&) {
        return 0;  // rejected with a message: the expected outcome for malformed input
    }
    // Accepted: the same header must be rejected when the data area is one byte too short.
    if (max_end > 0) {
        try {
            cpfill::parse_safetensors_header(text, max_end - 1, "fuzz", nullptr);
        } catch (const cpfill::Error&) {
            return 0;
        }
        __builtin_trap();
    }
    return 0;
}
