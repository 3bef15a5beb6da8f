// safetensors writing: one file, or shards plus model.safetensors.index.json (the HF layout).
// Data is contiguous in the given order with no gaps (the reference Rust reader rejects gaps); the
// header is padded with spaces so the data area starts 8-byte aligned. Every file goes through an
// AtomicFile: a failed write leaves no truncated file.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace cpfill {

namespace fs = std::filesystem;

namespace {

using ojson = nlohmann::ordered_json;  // keeps the header in the order the tensors were given

void check_names(const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::string& path) {
    std::set<std::string> seen;
    for (const auto& [name, t] : tensors) {
        CPFILL_CHECK(!name.empty() && name != "__metadata__",
                     "{}: invalid tensor name '{}' (empty or reserved)", path, name);
        CPFILL_CHECK(seen.insert(name).second, "{}: tensor '{}' given twice", path, name);
        CPFILL_CHECK(t.defined(), "{}: tensor '{}' {} has no data", path, name,
                     shape_str(t.shape()));
    }
}

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    check_names(tensors, path);
    ojson header = ojson::object();
    if (!metadata.empty()) {
        ojson meta = ojson::object();
        for (const auto& [key, value] : metadata) meta[key] = value;
        header["__metadata__"] = std::move(meta);
    }
    size_t offset = 0;
    for (const auto& [name, t] : tensors) {
        header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                        {"shape", t.shape()},
                        {"data_offsets", {offset, offset + t.nbytes()}}};
        offset += t.nbytes();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // 8 + header length ≡ 0 (mod 8)

    AtomicFile out(path);  // a failure leaves the old file (or none), never a truncated one
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
        len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), text.size());
    for (const auto& [name, t] : tensors) out.write(t.raw(), t.nbytes());
    out.commit();
}

void write_safetensors_sharded(const std::string& dir,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               size_t max_shard_bytes) {
    CPFILL_CHECK(max_shard_bytes > 0, "{}: max_shard_bytes must be positive", dir);
    check_names(tensors, dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    CPFILL_CHECK(!ec && fs::is_directory(dir), "{}: cannot create folder: {}", dir, ec.message());

    // Greedy packing in the given order; a tensor larger than the limit gets a shard of its own.
    std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
    size_t shard_bytes = 0, total_bytes = 0;
    for (const auto& entry : tensors) {
        const size_t n = entry.second.nbytes();
        if (!shards.back().empty() && shard_bytes + n > max_shard_bytes) {
            shards.emplace_back();
            shard_bytes = 0;
        }
        shards.back().push_back(entry);
        shard_bytes += n;
        total_bytes += n;
    }
    if (shards.size() == 1) {
        write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0],
                          {{"format", "pt"}});
        return;
    }
    ojson weight_map = ojson::object();
    for (size_t i = 0; i < shards.size(); ++i) {
        const std::string file =
            fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
        write_safetensors((fs::path(dir) / file).string(), shards[i], {{"format", "pt"}});
        for (const auto& [name, t] : shards[i]) weight_map[name] = file;
    }
    const ojson index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomically((fs::path(dir) / "model.safetensors.index.json").string(),
                          index.dump(2) + "\n");
}

}  // namespace cpfill
