// The attention sub-block of one layer (docs/architecture.md §3.4–3.7) on the CPU backend, cut
// where context parallelism needs a collective (docs/design.md §4):
//   attn_pack     local rows → what the KV store needs of them (key, compressor projections);
//   attn_queries  local rows → queries, indexer queries and head weights;
//   attn_output   local queries against the KV store (which by then holds every token of the
//                 batch) → sparse attention with sinks, de-rotation, grouped output projection.
#pragma once

#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "model/kv_store.h"
#include "model/weights.h"
#include "ops/rope.h"

namespace cpfill {

// Rows processed by one rank: per row its token, request, position, and whether it is real (pad
// rows are computed but never attend, never enter the KV store and are dropped).
struct Rows {
    std::vector<int32_t> tokens;
    std::vector<int32_t> request;
    std::vector<int64_t> pos;
    std::vector<uint8_t> valid;
    int64_t n() const { return static_cast<int64_t>(tokens.size()); }
};

struct RopeTables {
    ops::RopeTable main;      // sliding-only layers
    ops::RopeTable compress;  // CSA / HCA layers
    explicit RopeTables(const ModelConfig& cfg);
    const ops::RopeTable& for_layer(AttnType t) const {
        return t == AttnType::Sliding ? main : compress;
    }
};

struct AttnScratch {
    std::vector<float> cq, q, qI, wI, o, y;
};

// xn: f32 [n, d_model] → packed: f32 [n, packed_widths(cfg, L.type).total()].
void attn_pack(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
               const Rows& rows, const float* xn, float* packed, ThreadPool& pool);

void attn_queries(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
                  const Rows& rows, const float* xn, AttnScratch& s, ThreadPool& pool);

// store[request][layer] must hold every token up to each valid row's position. out: f32
// [n, d_model] (zeros on pad rows). topk (optional): i32 [n, index_topk] selections, −1 padded.
void attn_output(const LayerWeights& L, int layer, const ModelConfig& cfg, const RopeTables& ropes,
                 const Rows& rows, const KvStore& store, AttnScratch& s, float* out, int32_t* topk,
                 ThreadPool& pool);

}  // namespace cpfill
