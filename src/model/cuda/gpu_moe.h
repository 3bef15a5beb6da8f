// The MoE sub-block on the GPU (dsv4-architecture.md §3.8; design.md §4 step 5): router on all
// rows (learned or hash), the (token, expert) assignments sorted by expert, one GEMM pair per
// expert over its contiguous rows (this rank's slice of its width), the shared expert over all
// rows, and the weighted sum per token. The result is this rank's partial sum (bf16), which the
// reduce-scatter adds up over the ranks.
#pragma once

#include <cstdint>

#include "model/cuda/gpu_attention.h"

namespace cpfill::cuda {

struct GpuMoeScratch {
    float* logits = nullptr;   // [rows, n_experts]
    int64_t* hash = nullptr;   // [rows, top_k]
    int32_t* idx = nullptr;    // [rows · top_k]
    float* weight = nullptr;   // [rows · top_k]
    int32_t* perm = nullptr;   // [rows · top_k]
    int32_t* keys = nullptr;   // [rows · top_k]
    int32_t* ids = nullptr;    // [rows · top_k]
    int32_t* inv = nullptr;    // [rows · top_k]
    int32_t* counts = nullptr;      // device [n_experts]
    int32_t* host_counts = nullptr;  // pinned host [n_experts]
    void* sort_scratch = nullptr;
    size_t sort_bytes = 0;
    bf16* xp = nullptr;    // [rows · top_k, d_model]
    float* sp = nullptr;   // [rows · top_k]
    bf16* gu = nullptr;    // [rows · top_k, 2 · width]
    bf16* act = nullptr;   // [rows · top_k, width]
    bf16* op = nullptr;    // [rows · top_k, d_model]
    float* acc = nullptr;  // [rows, d_model]
};

// y bf16 [rows, d_model] (normed MoE input of every row, rank-major), tokens device int32 [rows]
// (hash routing) → out bf16 [rows, d_model]. One host wait (the expert counts, to size the GEMMs).
void gpu_moe_forward(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const bf16* y,
                     const int32_t* tokens, int64_t rows, GpuMoeScratch& s, bf16* out);

}  // namespace cpfill::cuda
