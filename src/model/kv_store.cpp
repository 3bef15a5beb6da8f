// kv_append: window keys, compressor tails and pooling of newly completed windows.
#include "model/kv_store.h"

#include <cstring>

#include "ops/compressor.h"
#include "ops/norm.h"

namespace cpfill {

PackedWidths packed_widths(const ModelConfig& cfg, AttnType type) {
    PackedWidths w;
    w.key = cfg.head_dim;
    if (type == AttnType::HCA) w.comp = cfg.head_dim;
    if (type == AttnType::CSA) {
        w.comp = 2 * cfg.head_dim;
        w.index = 2 * cfg.index_head_dim;
    }
    return w;
}

namespace {

// Buffers `n` rows of (C, Z) at columns [c_off, c_off + width) and [z_off, …) of the packed rows,
// pools windows [first, last) into `dst`, then drops rows no future window needs.
void compress_append(CompressorTail& tail, const CompressorWeights& W, const ModelConfig& cfg,
                     const ops::RopeTable& rope, int ratio, int64_t dim, bool overlap,
                     const float* packed, int64_t ld, int64_t c_off, int64_t z_off, int64_t n,
                     int64_t n_tokens_after, int64_t first, std::vector<float>& dst) {
    const int64_t width = overlap ? 2 * dim : dim;
    const size_t old_rows = tail.kv.size() / width;
    tail.kv.resize((old_rows + n) * width);
    tail.gate.resize((old_rows + n) * width);
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&tail.kv[(old_rows + i) * width], packed + i * ld + c_off, width * 4);
        std::memcpy(&tail.gate[(old_rows + i) * width], packed + i * ld + z_off, width * 4);
    }
    const int64_t last = n_tokens_after / ratio;
    if (last > first) {
        dst.resize(last * dim);
        float* out = dst.data() + first * dim;
        ops::compress_pool({ratio, dim, overlap}, tail.kv.data(), tail.gate.data(), tail.pos0,
                           W.ape.f32(), first, last, out);
        ops::rmsnorm(out, last - first, dim, W.norm.f32(), static_cast<float>(cfg.norm_eps), out);
        std::vector<int64_t> pos(last - first);
        for (int64_t w = first; w < last; ++w) pos[w - first] = w * ratio;
        ops::apply_rope(rope, out, last - first, dim, 1, static_cast<int>(dim), pos.data(), false);
    }
    // Keep what the next entry needs: its own window, and (CSA) the window before it.
    const int64_t keep_from = std::max<int64_t>(0, (last - (overlap ? 1 : 0)) * ratio);
    if (keep_from > tail.pos0) {
        const int64_t drop = keep_from - tail.pos0;
        tail.kv.erase(tail.kv.begin(), tail.kv.begin() + drop * width);
        tail.gate.erase(tail.gate.begin(), tail.gate.begin() + drop * width);
        tail.pos0 = keep_from;
    }
}

}  // namespace

void kv_append(LayerKv& kv, const LayerWeights& L, const ModelConfig& cfg,
               const ops::RopeTable& rope, const float* packed, int64_t ld, int64_t n) {
    const PackedWidths w = packed_widths(cfg, L.type);
    const int64_t d = cfg.head_dim;
    kv.window.resize((kv.n_tokens + n) * d);
    for (int64_t i = 0; i < n; ++i)
        std::memcpy(&kv.window[(kv.n_tokens + i) * d], packed + i * ld, d * sizeof(float));
    const int64_t after = kv.n_tokens + n;
    if (L.type != AttnType::Sliding) {
        const bool csa = L.type == AttnType::CSA;
        const int ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
        const int64_t first = kv.n_entries;
        compress_append(kv.main_tail, L.attn.compressor, cfg, rope, ratio, d, csa, packed, ld,
                        w.key, w.key + w.comp, n, after, first, kv.entries);
        if (csa) {
            compress_append(kv.index_tail, L.attn.idx_compressor, cfg, rope, ratio,
                            cfg.index_head_dim, true, packed, ld, w.key + 2 * w.comp,
                            w.key + 2 * w.comp + w.index, n, after, first, kv.index_keys);
            // The study's rounding (LayerWeights::indexer_rounding) of the entries just pooled,
            // after kv_norm + RoPE: what the indexer will score them as.
            const int64_t dI = cfg.index_head_dim, last = after / ratio;
            if (last > first)
                ops::round_indexer_rows(L.indexer_rounding, kv.index_keys.data() + first * dI,
                                        last - first, dI);
        }
        kv.n_entries = after / ratio;
    }
    kv.n_tokens = after;
}

}  // namespace cpfill
