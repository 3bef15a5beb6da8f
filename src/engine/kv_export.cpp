// write_kv_state: slices of the KV store in the documented layout.
#include "engine/kv_export.h"

#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/safetensors.h"

namespace cpfill {

namespace {

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

}  // namespace

void write_kv_state(const std::string& dir, const KvStore& store, const ModelConfig& cfg) {
    std::filesystem::create_directories(dir);
    const int64_t d = cfg.head_dim, dI = cfg.index_head_dim;
    for (size_t r = 0; r < store.size(); ++r) {
        std::vector<std::pair<std::string, Tensor>> out;
        std::map<std::string, std::string> meta = {{"format", "cpfill-kv-state-1"}};
        int64_t n_tokens = 0;
        for (int l = 0; l < cfg.n_layers; ++l) {
            const LayerKv& kv = store[r][l];
            const std::string p = "layers." + std::to_string(l) + ".";
            const AttnType type = cfg.layer_types[l];
            n_tokens = kv.n_tokens;
            const int64_t keep = std::min<int64_t>(kv.n_tokens, cfg.window - 1);
            CPFILL_CHECK(
                kv.window0 <= kv.n_tokens - keep &&
                    static_cast<int64_t>(kv.window.size()) == (kv.n_tokens - kv.window0) * d,
                "{}window: {} keys from position {} cannot give the last {} of {}", p,
                kv.window.size() / d, kv.window0, keep, kv.n_tokens);
            out.emplace_back(p + "window", rows_tensor(kv.window, kv.n_tokens - keep - kv.window0,
                                                       keep, d, 0, d));
            meta[p + "type"] = std::string(attn_type_name(type));
            if (type == AttnType::Sliding) continue;
            const bool csa = type == AttnType::CSA;
            const int ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
            meta[p + "n_entries"] = std::to_string(kv.n_entries);
            out.emplace_back(p + "entries", rows_tensor(kv.entries, 0, kv.n_entries, d, 0, d));
            add_tail(out, p + "compressor.", kv.main_tail, kv.n_tokens, kv.n_entries, ratio, d,
                     csa);
            if (csa) {
                out.emplace_back(p + "index_keys",
                                 rows_tensor(kv.index_keys, 0, kv.n_entries, dI, 0, dI));
                add_tail(out, p + "indexer.", kv.index_tail, kv.n_tokens, kv.n_entries, ratio, dI,
                         true);
            }
        }
        meta["n_tokens"] = std::to_string(n_tokens);
        write_safetensors(dir + "/request_" + std::to_string(r) + ".safetensors", out, meta);
    }
}

}  // namespace cpfill
