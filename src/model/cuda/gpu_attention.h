// The attention sub-block on the GPU (docs/architecture.md §3.4–3.7), cut like the CPU backend's
// model/attention.h: pack (what the KV store needs of the local rows), queries, the KV-store
// update from the gathered rows, and the output (indexer top-k, sparse attention with sinks,
// de-rotation, grouped output projection). bf16 activations, fp32 statistics (docs/design.md §3).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "model/cuda/gpu_context.h"
#include "model/cuda/gpu_weights.h"

namespace cpfill::cuda {

using bf16 = __nv_bfloat16;

// One request's KV store for one layer on this GPU, in global token order (capacities planned
// from the request's length and the chunk). The window keys are a buffer of window_cap rows
// holding positions window0 … n_tokens − 1: every position in one pass; in chunks, the chunk's
// and at least the window − 1 before it (gpu_kv_append moves those to the front when the next
// segment does not fit), so the store's window part is bounded by the chunk, not the prompt.
struct GpuLayerKv {
    bf16* window = nullptr;      // [window_cap, head_dim], row r = position window0 + r
    bf16* entries = nullptr;     // [n_entries, head_dim]
    bf16* index_keys = nullptr;  // [n_entries, index_head_dim] (CSA)
    int64_t n_tokens = 0, n_entries = 0;
    int64_t window0 = 0, window_cap = 0;
};
using GpuKvStore = std::vector<std::vector<GpuLayerKv>>;  // [request][layer]

// Rows of a request's window-key buffer: the whole request when a run is one pass (chunk_tokens
// ≥ len), else the chunk's tokens and twice window − 1: room for the window − 1 keys kept from
// before plus a gap of as many, so that the rows moved to the front never overlap their source.
int64_t window_rows(int64_t len, int64_t chunk_tokens, int window);

// Local rows of one sub-batch on this rank: positions on the device, and the runs of valid rows
// of one request (pad rows belong to none).
struct LocalSegment {
    int request = 0;
    int64_t begin = 0, end = 0;
};
struct GpuRows {
    int64_t n = 0;
    const int64_t* pos = nullptr;  // device [n]
    std::vector<LocalSegment> segments;
};

// Scratch shared by the sub-batches (their stages run in order on one stream).
struct GpuAttnScratch {
    bf16* cq = nullptr;       // [n, q_rank]
    bf16* q = nullptr;        // [n, n_heads · head_dim]
    bf16* o = nullptr;        // [n, n_heads · head_dim]
    bf16* yo = nullptr;       // [n, o_groups · o_rank]
    bf16* qI = nullptr;       // [n, index_n_heads · index_head_dim]
    float* wI = nullptr;      // [n, index_n_heads]
    int32_t* topk = nullptr;  // [n, index_topk]
    float* scores = nullptr;  // indexer scores, scores_floats
    int64_t scores_floats = 0;
    const int64_t* win_pos_csa = nullptr;  // [max entries] w · csa_ratio
    const int64_t* win_pos_hca = nullptr;  // [max entries] w · hca_ratio
};

// y[n, out] (bf16 or fp32, row stride ldy) = x[n, in] (bf16, row stride ldx) · wᵀ: bf16 GEMM, or
// for an fp8 matrix the activation quantised into c.fp8 and the block-scaled GEMM.
void gpu_linear(const GpuCtx& c, const GpuMatrix& w, const bf16* x, int64_t ldx, int64_t n,
                bf16* y_bf16, float* y_f32, int64_t ldy);

// xn bf16 [n, d_model] (normed) → packed bf16 [n, packed_widths(cfg, L.type).total()] (kv_store.h:
// [key | C | Z | C_idx | Z_idx], as the CPU backend packs them).
void gpu_attn_pack(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const GpuRows& rows,
                   const bf16* xn, bf16* packed, GpuAttnScratch& s);
// xn → s.q (RoPE'd), and for CSA s.qI, s.wI.
void gpu_attn_queries(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const GpuRows& rows,
                      const bf16* xn, GpuAttnScratch& s);
// Appends positions pos0 … pos0 + len − 1 of a request from packed rows (row stride ld; row r is
// position row0 + r of the request, row0 ≤ pos0, so rows before pos0 − row0 are the request's
// earlier tokens, which the windows completed here may pool) and pools the windows they complete.
// Throws when a window needs a position before row0.
void gpu_kv_append(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const bf16* rows,
                   int64_t ld, int64_t row0, int64_t pos0, int64_t len, GpuLayerKv& kv,
                   const GpuAttnScratch& s);
// Local queries against the store → out bf16 [n, d_model] (zeros on pad rows); s.topk holds the
// indexer selections (−1 padded; −1 on pad rows) of CSA layers.
void gpu_attn_output(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, int layer,
                     const GpuRows& rows, const GpuKvStore& store, GpuAttnScratch& s, bf16* out);

}  // namespace cpfill::cuda
