// Lightning-indexer scoring and top-k on the GPU (docs/architecture.md §3.7 steps 4–5, the
// semantics of ops/indexer.h): score[t, w] = scale · Σ_h weight[t, h] · ReLU(q[t, h] · key[w]) over
// the eligible entries w < min((p + 1) / ratio, n_entries), then the top_k largest scores (ties:
// lower index first, as the CPU backend).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// How the scores are computed: from bf16 operands, or from the queries' head rows and the keys
// rounded to e4m3 per row of 128 channels (ops::round_indexer_rows(Fp8) on the CPU; compute
// capability 9.0). On Hopper both run the wgmma kernel of ops/cuda/indexer_hopper.h; bf16 on other
// GPUs (or with IndexerArgs::mma_sync) an mma.sync kernel. fp32 sums either way.
enum class IndexerPrecision { Bf16, Fp8 };

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
    IndexerPrecision precision = IndexerPrecision::Bf16;
    bool mma_sync = false;  // Bf16: the mma.sync kernel even on Hopper (the tests pin both kernels)
};

// Floats of scratch that indexer_topk needs to run `rows` queries per chunk over n_entries
// entries: their scores, and for Fp8 also the quantised keys (fixed) and the chunk's quantised
// queries.
int64_t indexer_scratch_floats(IndexerPrecision precision, int64_t n_entries, int64_t rows);

// scores: fp32 scratch of at least indexer_scratch_floats(precision, n_entries, 1) floats; queries
// run in chunks of as many rows as it holds (indexer_scratch_floats(…, n_q) does all in one pass;
// the chunk's scores start at scores[0]). q and keys must be 16-byte aligned. Scores come from
// bf16 (or e4m3) operands with fp32 accumulation on tensor cores; near-ties may select differently
// from the fp32 CPU backend (docs/design.md §3), exact ties never do.
void indexer_topk(const IndexerArgs& a, float* scores, int64_t scores_floats, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
