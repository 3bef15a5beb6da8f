// write_kv_state: slices of the KV store in the documented layout, plus the folder's manifest.
#include "engine/kv_export.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_excerpt.h"
#include "io/safetensors.h"

namespace cpfill {

namespace {

namespace fs = std::filesystem;

Tensor rows_tensor(const std::vector<float>& data, int64_t row0, int64_t rows, int64_t width,
                   int64_t col0, int64_t cols) {
    Tensor t = Tensor::empty(DType::F32, {rows, cols});
    for (int64_t r = 0; r < rows; ++r)
        std::copy(data.begin() + (row0 + r) * width + col0,
                  data.begin() + (row0 + r) * width + col0 + cols, t.f32() + r * cols);
    return t;
}

// Buffered tail and (CSA) overlap half of one compressor.
void add_tail(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix,
              const CompressorTail& tail, int64_t n_tokens, int64_t n_entries, int ratio,
              int64_t dim, bool overlap) {
    const int64_t width = overlap ? 2 * dim : dim;
    const int64_t rows = static_cast<int64_t>(tail.kv.size()) / width;
    const int64_t buf0 = n_entries * ratio - tail.pos0;  // first buffered token's row in the tail
    CPFILL_CHECK(buf0 >= 0 && buf0 <= rows && tail.pos0 + rows == n_tokens,
                 "{}: inconsistent compressor tail (rows {}, pos0 {}, tokens {}, entries {})",
                 prefix, rows, tail.pos0, n_tokens, n_entries);
    out.emplace_back(prefix + "buffer_kv",
                     rows_tensor(tail.kv, buf0, rows - buf0, width, 0, width));
    out.emplace_back(prefix + "buffer_gate",
                     rows_tensor(tail.gate, buf0, rows - buf0, width, 0, width));
    if (overlap && n_entries > 0) {
        out.emplace_back(prefix + "overlap_kv",
                         rows_tensor(tail.kv, buf0 - ratio, ratio, width, 0, dim));
        out.emplace_back(prefix + "overlap_gate",
                         rows_tensor(tail.gate, buf0 - ratio, ratio, width, 0, dim));
    }
}

bool looks_like_kv_file(const std::string& name) {
    static const std::regex re("request_[0-9]+\\.safetensors");
    return std::regex_match(name, re);
}

// The manifest's file list; throws naming the manifest when it is not one of ours.
std::vector<std::string> read_manifest(const fs::path& path) {
    std::ifstream in(path);
    CPFILL_CHECK(in.good(), "--kv-out: cannot read {}", path.string());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    const bool ours = j.is_object() && j.value("format", "") == "cpfill-kv-manifest-1" &&
                      j.contains("files") && j["files"].is_array();
    CPFILL_CHECK(ours,
                 "--kv-out: {} is not a cpfill KV manifest (expected an object with format "
                 "cpfill-kv-manifest-1 and a files list): remove it or choose another folder",
                 path.string());
    std::vector<std::string> files;
    for (const auto& f : j["files"]) {
        CPFILL_CHECK(f.is_string() && looks_like_kv_file(f.get<std::string>()),
                     "--kv-out: {}: the files list holds {}, expected names "
                     "request_<r>.safetensors: remove it or choose another folder",
                     path.string(), json_excerpt(f));
        files.push_back(f.get<std::string>());
    }
    return files;
}

void write_manifest(const fs::path& dir, const std::vector<std::string>& files, bool complete,
                    const std::vector<int64_t>& n_tokens) {
    nlohmann::ordered_json j = {
        {"format", "cpfill-kv-manifest-1"}, {"complete", complete}, {"files", files}};
    if (complete) j["n_tokens"] = n_tokens;
    write_file_atomically((dir / kKvManifest).string(), j.dump(2) + "\n");
}

// The tensors of one request's file (see the header for the layout).
std::vector<std::pair<std::string, Tensor>> request_tensors(
    const std::vector<LayerKv>& layers, const ModelConfig& cfg,
    std::map<std::string, std::string>& meta, int64_t& n_tokens) {
    std::vector<std::pair<std::string, Tensor>> out;
    const int64_t d = cfg.head_dim, dI = cfg.index_head_dim;
    for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerKv& kv = layers[l];
        const std::string p = "layers." + std::to_string(l) + ".";
        const AttnType type = cfg.layer_types[l];
        n_tokens = kv.n_tokens;
        const int64_t keep = std::min<int64_t>(kv.n_tokens, cfg.window - 1);
        CPFILL_CHECK(kv.window0 <= kv.n_tokens - keep &&
                         static_cast<int64_t>(kv.window.size()) == (kv.n_tokens - kv.window0) * d,
                     "{}window: {} keys from position {} cannot give the last {} of {}", p,
                     kv.window.size() / d, kv.window0, keep, kv.n_tokens);
        out.emplace_back(p + "window",
                         rows_tensor(kv.window, kv.n_tokens - keep - kv.window0, keep, d, 0, d));
        meta[p + "type"] = std::string(attn_type_name(type));
        if (type == AttnType::Sliding) continue;
        const bool csa = type == AttnType::CSA;
        const int ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
        meta[p + "n_entries"] = std::to_string(kv.n_entries);
        out.emplace_back(p + "entries", rows_tensor(kv.entries, 0, kv.n_entries, d, 0, d));
        add_tail(out, p + "compressor.", kv.main_tail, kv.n_tokens, kv.n_entries, ratio, d, csa);
        if (csa) {
            out.emplace_back(p + "index_keys",
                             rows_tensor(kv.index_keys, 0, kv.n_entries, dI, 0, dI));
            add_tail(out, p + "indexer.", kv.index_tail, kv.n_tokens, kv.n_entries, ratio, dI,
                     true);
        }
    }
    return out;
}

}  // namespace

std::vector<std::string> kv_state_files(size_t n_requests) {
    std::vector<std::string> out;
    for (size_t r = 0; r < n_requests; ++r)
        out.push_back("request_" + std::to_string(r) + ".safetensors");
    return out;
}

std::vector<std::string> check_kv_out_dir(const std::string& dir) {
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    if (!fs::exists(st)) return {};
    CPFILL_CHECK(fs::is_directory(st), "--kv-out {}: exists and is not a folder", dir);
    const fs::path manifest = fs::path(dir) / kKvManifest;
    std::vector<std::string> named;
    if (fs::exists(manifest, ec)) named = read_manifest(manifest);
    const std::set<std::string> known(named.begin(), named.end());
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        CPFILL_CHECK(!looks_like_kv_file(name) || known.count(name),
                     "--kv-out {}: {} is not named by {} (a run whose manifest was lost, or not "
                     "cpfill's): remove it or choose another folder",
                     dir, name,
                     named.empty() && !fs::exists(manifest) ? std::string("a manifest.json")
                                                            : manifest.string());
    }
    CPFILL_CHECK(!ec, "--kv-out {}: cannot list the folder ({})", dir, ec.message());
    return named;
}

size_t kv_state_bytes(const ModelConfig& cfg, int64_t n) {
    const int64_t d = cfg.head_dim, dI = cfg.index_head_dim;
    int64_t floats = 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
        const AttnType type = cfg.layer_types[l];
        floats += std::min<int64_t>(n, cfg.window - 1) * d;
        if (type == AttnType::Sliding) continue;
        const bool csa = type == AttnType::CSA;
        const int64_t ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
        const int64_t entries = n / ratio, tail = n - entries * ratio;
        floats += entries * d + 2 * tail * (csa ? 2 * d : d);
        if (!csa) continue;
        if (entries > 0) floats += 2 * ratio * d + 2 * ratio * dI;
        floats += entries * dI + 2 * tail * 2 * dI;
    }
    return static_cast<size_t>(floats) * sizeof(float);
}

void write_kv_state(const std::string& dir, const KvStore& store, const ModelConfig& cfg) {
    const std::vector<std::string> old = check_kv_out_dir(dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    CPFILL_CHECK(!ec, "--kv-out {}: cannot create the folder ({})", dir, ec.message());
    const std::vector<std::string> files = kv_state_files(store.size());
    // While writing, the manifest names the old files and the new ones, marked incomplete: a run
    // that stops halfway leaves a folder that the next run cleans and that no reader trusts.
    std::vector<std::string> all = files;
    for (const std::string& f : old)
        if (std::find(files.begin(), files.end(), f) == files.end()) all.push_back(f);
    write_manifest(dir, all, false, {});
    std::vector<int64_t> n_tokens;
    for (size_t r = 0; r < store.size(); ++r) {
        std::map<std::string, std::string> meta = {{"format", "cpfill-kv-state-1"}};
        int64_t n = 0;
        auto tensors = request_tensors(store[r], cfg, meta, n);
        meta["n_tokens"] = std::to_string(n);
        n_tokens.push_back(n);
        write_safetensors((fs::path(dir) / files[r]).string(), tensors, meta);
    }
    for (size_t i = files.size(); i < all.size(); ++i) {
        fs::remove(fs::path(dir) / all[i], ec);
        CPFILL_CHECK(!ec, "--kv-out {}: cannot remove the earlier run's {} ({})", dir, all[i],
                     ec.message());
    }
    write_manifest(dir, files, true, n_tokens);
}

}  // namespace cpfill
