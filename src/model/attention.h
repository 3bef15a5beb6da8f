// The attention sub-block of one layer (dsv4-architecture.md §3.4–3.7) on the CPU backend:
// projections, window keys, compressed entries (CSA / HCA), lightning indexer, sparse attention
// with sinks, de-rotation and the grouped output projection. Queries read a per-request KV store.
#pragma once

#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "model/batch.h"
#include "model/weights.h"
#include "ops/rope.h"

namespace cpfill {

// What one layer keeps for one request: every token's window key (K = V) and the compressed
// entries in global order. (The decoder-facing state exported later is a suffix of this.)
struct LayerKv {
    std::vector<float> window;      // [n_tokens, head_dim]
    std::vector<float> entries;     // [n_entries, head_dim] main compressed entries
    std::vector<float> index_keys;  // [n_entries, index_head_dim] (CSA)
    int64_t n_entries = 0;
};

struct RopeTables {
    ops::RopeTable main;      // sliding-only layers
    ops::RopeTable compress;  // CSA / HCA layers
    explicit RopeTables(const ModelConfig& cfg);
    const ops::RopeTable& for_layer(AttnType t) const {
        return t == AttnType::Sliding ? main : compress;
    }
};

// xn: f32 [n_tokens, d_model] (attention input after attn_norm) → out: f32 [n_tokens, d_model].
// kv: one LayerKv per request of the batch (filled here). topk (optional): i32
// [n_tokens, index_topk] selected entries, −1 where fewer are eligible (CSA layers).
void attention_forward(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
                       const Batch& batch, const float* xn, std::vector<LayerKv>& kv, float* out,
                       int32_t* topk, ThreadPool& pool);

}  // namespace cpfill
