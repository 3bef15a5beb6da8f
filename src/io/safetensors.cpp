// safetensors reading: header parsing/validation and the mmapped SafetensorsFile.
// Every malformation is a cpfill::Error naming the file (`source`), the tensor and expected vs
// found. Offsets may leave gaps (padding) but tensors may not overlap. Checks follow the header
// comment in safetensors.h; the order matters for the fuzzer: no value is used before it is
// checked.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "io/json_excerpt.h"

namespace cpfill {

namespace {

using json = nlohmann::json;

// A non-negative integer that fits in uint64_t, or nullopt.
std::optional<uint64_t> as_u64(const json& j) {
    if (j.is_number_unsigned()) return j.get<uint64_t>();
    if (j.is_number_integer() && j.get<int64_t>() >= 0)
        return static_cast<uint64_t>(j.get<int64_t>());
    return std::nullopt;
}

const json& field(const json& entry, const char* key, const std::string& source,
                  const std::string& name) {
    auto it = entry.find(key);
    CPFILL_CHECK(it != entry.end(), "{}: tensor '{}': missing field \"{}\"", source, name, key);
    return *it;
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, size_t data_size,
                              const std::string& source) {
    CPFILL_CHECK(entry.is_object(), "{}: tensor '{}': expected an object, found {}", source, name,
                 json_excerpt(entry));
    TensorInfo info;
    info.name = name;
    info.file = source;

    const json& dtype = field(entry, "dtype", source, name);
    CPFILL_CHECK(dtype.is_string(), "{}: tensor '{}': dtype: expected a string, found {}", source,
                 name, json_excerpt(dtype));
    auto parsed = parse_dtype(dtype.get_ref<const std::string&>());
    CPFILL_CHECK(parsed.has_value(),
                 "{}: tensor '{}': unknown dtype {} (expected one of F32, F16, BF16, F8_E4M3, "
                 "F8_E8M0, I8, U8, I16, I32, I64, BOOL)",
                 source, name, json_excerpt(dtype));
    info.dtype = *parsed;

    // size · (product of the non-zero dims) must fit in int64, whatever the order of the dims, so
    // that numel, strides and byte counts computed later from the Shape cannot overflow.
    const json& shape = field(entry, "shape", source, name);
    CPFILL_CHECK(shape.is_array(), "{}: tensor '{}': shape: expected an array, found {}", source,
                 name, json_excerpt(shape));
    constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
    for (const json& d : shape) {
        auto dim = as_u64(d);
        CPFILL_CHECK(dim.has_value() && *dim <= kMax,
                     "{}: tensor '{}': shape: expected non-negative integers, found {}", source,
                     name, json_excerpt(d));
        info.shape.push_back(static_cast<int64_t>(*dim));
    }
    uint64_t bytes = dtype_size(info.dtype);
    bool empty = false;
    for (int64_t dim : info.shape) {
        if (dim == 0) {
            empty = true;
            continue;
        }
        CPFILL_CHECK(static_cast<uint64_t>(dim) <= kMax / bytes,
                     "{}: tensor '{}': shape {} x {} overflows a 64-bit byte count", source, name,
                     shape_str(info.shape), info.dtype);
        bytes *= static_cast<uint64_t>(dim);
    }
    if (empty) bytes = 0;

    const json& offsets = field(entry, "data_offsets", source, name);
    CPFILL_CHECK(
        offsets.is_array() && offsets.size() == 2,
        "{}: tensor '{}': data_offsets: expected [begin, end], found {}", source, name,
        offsets.is_array() ? fmt::format("{} elements", offsets.size()) : json_excerpt(offsets));
    auto begin = as_u64(offsets[0]);
    auto end = as_u64(offsets[1]);
    CPFILL_CHECK(begin && end,
                 "{}: tensor '{}': data_offsets: expected non-negative integers, "
                 "found [{}, {}]",
                 source, name, json_excerpt(offsets[0]), json_excerpt(offsets[1]));
    CPFILL_CHECK(*begin <= *end, "{}: tensor '{}': data_offsets [{}, {}]: begin after end", source,
                 name, *begin, *end);
    CPFILL_CHECK(*end - *begin == bytes,
                 "{}: tensor '{}': data_offsets [{}, {}] hold {} bytes, expected {} ({} x {})",
                 source, name, *begin, *end, *end - *begin, bytes, info.dtype,
                 shape_str(info.shape));
    CPFILL_CHECK(*end <= data_size,
                 "{}: tensor '{}': data_offsets [{}, {}] end outside the data area of {} bytes",
                 source, name, *begin, *end, data_size);
    info.begin = static_cast<size_t>(*begin);
    info.end = static_cast<size_t>(*end);
    return info;
}

void parse_metadata(const json& meta, const std::string& source,
                    std::map<std::string, std::string>* metadata) {
    CPFILL_CHECK(meta.is_object(), "{}: __metadata__: expected an object, found {}", source,
                 json_excerpt(meta));
    for (const auto& [key, value] : meta.items()) {
        CPFILL_CHECK(value.is_string(), "{}: __metadata__[\"{}\"]: expected a string, found {}",
                     source, key, json_excerpt(value));
        if (metadata) (*metadata)[key] = value.get<std::string>();
    }
}

// Tensors sorted by begin must each start at or after the end of every earlier one. Empty
// tensors occupy no bytes and cannot overlap anything.
void check_no_overlap(const std::map<std::string, TensorInfo>& infos, const std::string& source) {
    std::vector<const TensorInfo*> sorted;
    for (const auto& [name, info] : infos)
        if (info.end > info.begin) sorted.push_back(&info);
    std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
    });
    for (size_t i = 1; i < sorted.size(); ++i) {
        const TensorInfo& a = *sorted[i - 1];
        const TensorInfo& b = *sorted[i];
        CPFILL_CHECK(b.begin >= a.end,
                     "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap: expected '{}' to begin "
                     "at or after {}",
                     source, a.name, a.begin, a.end, b.name, b.begin, b.end, b.name, a.end);
    }
}

}  // namespace

std::map<std::string, TensorInfo> parse_safetensors_header(
    const std::string& json_text, size_t data_size, const std::string& source,
    std::map<std::string, std::string>* metadata) {
    // nlohmann keeps the last of duplicate keys silently; the callback records top-level repeats.
    std::set<std::string> keys;
    std::string duplicate;
    auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
            !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
            duplicate = parsed.get<std::string>();
        return true;
    };
    json header;
    try {
        header = json::parse(json_text, on_event);
    } catch (const json::exception& e) {
        CPFILL_FAIL("{}: header is not valid JSON: {}", source, e.what());
    }
    CPFILL_CHECK(header.is_object(), "{}: header: expected a JSON object, found {}", source,
                 json_excerpt(header));
    CPFILL_CHECK(duplicate.empty(), "{}: header: key '{}' appears more than once", source,
                 duplicate);

    std::map<std::string, TensorInfo> infos;
    if (metadata) metadata->clear();
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            parse_metadata(entry, source, metadata);
            continue;
        }
        infos.emplace(name, parse_tensor_entry(name, entry, data_size, source));
    }
    check_no_overlap(infos, source);
    return infos;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    CPFILL_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        CPFILL_FAIL("{}: not a regular file", path);
    }
    const size_t file_size = static_cast<size_t>(st.st_size);
    if (file_size < 8) {
        ::close(fd);
        CPFILL_FAIL("{}: truncated file: {} bytes, expected at least 8 (the header length)", path,
                    file_size);
    }
    void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    CPFILL_CHECK(base != MAP_FAILED, "{}: mmap of {} bytes failed: {}", path, file_size,
                 std::strerror(mmap_errno));
    mapping_ = std::shared_ptr<const void>(
        base, [file_size](const void* p) { ::munmap(const_cast<void*>(p), file_size); });

    const auto* bytes = static_cast<const std::byte*>(base);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i)  // little-endian
        header_len = (header_len << 8) | static_cast<uint64_t>(bytes[i]);
    CPFILL_CHECK(header_len <= file_size - 8,
                 "{}: header length {} runs past the end of the file: expected at most {} "
                 "(file size {} - 8)",
                 path, header_len, file_size - 8, file_size);
    data_ = bytes + 8 + header_len;
    const size_t data_size = file_size - 8 - static_cast<size_t>(header_len);
    std::string text(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(header_len));
    infos_ = parse_safetensors_header(text, data_size, path, &metadata_);
}

Tensor SafetensorsFile::get(const std::string& name) const {
    auto it = infos_.find(name);
    CPFILL_CHECK(it != infos_.end(), "{}: no tensor named '{}' ({} tensors in the file)", path_,
                 name, infos_.size());
    const TensorInfo& info = it->second;
    const std::byte* p = data_ + info.begin;
    Tensor view = Tensor::borrow(info.dtype, info.shape, p, mapping_);
    // Writers only align the data area; a tensor after an odd-sized one may be misaligned for its
    // element type. Such tensors are copied into owned (aligned) memory.
    if (reinterpret_cast<uintptr_t>(p) % dtype_size(info.dtype) != 0) return view.clone();
    return view;
}

}  // namespace cpfill
