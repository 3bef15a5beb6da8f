// Lightning-indexer scoring and top-k on the GPU (docs/architecture.md §3.7 steps 4–5, the
// semantics of ops/indexer.h): score[t, w] = scale · Σ_h weight[t, h] · ReLU(q[t, h] · key[w]) over
// the eligible entries w < min((p + 1) / ratio, n_entries), then the top_k largest scores (ties:
// lower index first, as the CPU backend).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

struct IndexerArgs {
    const __nv_bfloat16* q = nullptr;  // [n_q, n_heads, dim] indexer queries, RoPE applied
    const float* weight = nullptr;  // fp32 [n_q, n_heads] head weights (already × n_heads^−½)
    const int64_t* pos = nullptr;   // device [n_q] query positions inside the request
    int64_t n_q = 0;
    int n_heads = 0;                      // ≤ 64
    int dim = 0;                          // multiple of 16, ≤ 128
    const __nv_bfloat16* keys = nullptr;  // [n_entries, dim] indexer keys of the request
    int64_t n_entries = 0;
    int ratio = 4;
    int64_t top_k = 0;
    float scale = 0.0f;      // dim^−½
    int32_t* idx = nullptr;  // [n_q, top_k] out: the selected entries in ascending order, then −1
};

// scores: fp32 scratch of at least n_entries floats; queries run in chunks of
// scores_floats / n_entries rows (give n_q · n_entries to do all in one pass). q and keys must be
// 16-byte aligned. Scores come from bf16 operands with fp32 accumulation on tensor cores;
// near-ties may select differently from the fp32 CPU backend (docs/design.md §3), exact ties never
// do.
void indexer_topk(const IndexerArgs& a, float* scores, int64_t scores_floats, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
