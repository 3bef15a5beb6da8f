// safetensors files: a validating mmap reader (one file, or a sharded folder with
// model.safetensors.index.json) and a writer (one file, or shards + index).
// Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data. Offsets are relative to
// the end of the header. The reader checks: header inside the file, JSON well formed, known dtype,
// end - begin == numel * dtype size, offsets inside the data area, no two tensors overlapping.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace cpfill {

struct TensorInfo {
    std::string name;
    DType dtype;
    Shape shape;
    size_t begin = 0;  // byte offsets inside the data area
    size_t end = 0;
    std::string file;  // path of the file holding it
};

// One mmapped safetensors file. Tensors returned by get() borrow the mapping (and keep it alive).
class SafetensorsFile {
  public:
    explicit SafetensorsFile(const std::string& path);  // throws cpfill::Error on any malformation
    const std::string& path() const { return path_; }
    const std::map<std::string, TensorInfo>& tensors() const { return infos_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool has(const std::string& name) const { return infos_.count(name) > 0; }
    // Zero-copy view (an owned copy when the bytes are misaligned for the dtype); throws if absent.
    Tensor get(const std::string& name) const;

  private:
    std::string path_;
    std::shared_ptr<const void> mapping_;  // the whole file
    const std::byte* data_ = nullptr;      // start of the data area
    std::map<std::string, TensorInfo> infos_;
    std::map<std::string, std::string> metadata_;
};

// Parses and validates a header (the JSON text) against a data area of `data_size` bytes.
// Separate from the file so that the fuzzer can drive it.
std::map<std::string, TensorInfo> parse_safetensors_header(
    const std::string& json_text, size_t data_size, const std::string& source,
    std::map<std::string, std::string>* metadata);

// A checkpoint folder or a single .safetensors file: all tensors by name across shards.
class SafetensorsSet {
  public:
    // `path`: a .safetensors file, or a folder with model.safetensors.index.json, or a folder with
    // exactly one or more *.safetensors files (all are read).
    explicit SafetensorsSet(const std::string& path);
    std::vector<std::string> names() const;  // sorted
    bool has(const std::string& name) const;
    const TensorInfo& info(const std::string& name) const;  // throws naming the tensor if absent
    Tensor get(const std::string& name) const;

  private:
    std::string path_;  // as given, for error messages
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, const SafetensorsFile*> where_;
};

// Writes one safetensors file (tensors in the given order, 8-byte aligned data).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into `dir` as shards of at most `max_shard_bytes` each
// (model-00001-of-0000N.safetensors) plus model.safetensors.index.json; a single file
// model.safetensors when everything fits in one shard.
void write_safetensors_sharded(const std::string& dir,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               size_t max_shard_bytes);

}  // namespace cpfill
