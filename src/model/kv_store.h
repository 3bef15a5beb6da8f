// The KV store (docs/design.md §4): per request and layer, in global token order, every key of the
// window branch (K = V), the compressed entries (main, and indexer keys in CSA layers) and the
// compressors' buffered tails — the projections of tokens whose windows are not complete yet (and,
// for CSA, of the last complete window, whose Ca half the next entry needs). Appending tokens pools
// every window they complete, so one pass and any split into chunks give the same entries.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"
#include "ops/rope.h"

namespace cpfill {

struct CompressorTail {
    int64_t pos0 = 0;         // position of the first buffered token
    std::vector<float> kv;    // [n_tokens - pos0, width]
    std::vector<float> gate;  // [n_tokens - pos0, width]
};

struct LayerKv {
    int64_t n_tokens = 0;
    std::vector<float> window;  // [n_tokens − window0, head_dim]: keys of positions window0 …
    int64_t window0 = 0;        // 0 in the engine's store; the GPU export keeps only the last rows
    int64_t n_entries = 0;
    std::vector<float> entries;     // [n_entries, head_dim]
    std::vector<float> index_keys;  // [n_entries, index_head_dim] (CSA)
    CompressorTail main_tail, index_tail;
};

// Widths of one token's packed attention inputs for a layer: [key | C | Z | C_idx | Z_idx].
struct PackedWidths {
    int64_t key = 0, comp = 0, index = 0;  // comp / index: width of C (= of Z)
    int64_t total() const { return key + 2 * comp + 2 * index; }
};
PackedWidths packed_widths(const ModelConfig& cfg, AttnType type);

// Appends `n` tokens (positions kv.n_tokens …) given as packed rows [n, widths.total()] with
// row stride `ld`, and pools every window they complete (kv_norm, RoPE at the window start).
void kv_append(LayerKv& kv, const LayerWeights& L, const ModelConfig& cfg,
               const ops::RopeTable& rope, const float* packed, int64_t ld, int64_t n);

using KvStore = std::vector<std::vector<LayerKv>>;  // [request][layer]

}  // namespace cpfill
