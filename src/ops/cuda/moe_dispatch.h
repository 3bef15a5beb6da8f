// Token permutation of the GPU MoE (docs/architecture.md §3.8; docs/design.md §4 step 5): the
// n·top_k (token, expert) assignments sorted by expert (stable: token order inside an expert, so
// the result does not depend on scheduling), the rows gathered into one contiguous block per expert
// for the expert GEMMs, and the weighted expert outputs summed back per token.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cpfill::ops::cuda {

// Scratch bytes sort_by_expert needs for n_assign assignments (plan it up front).
size_t sort_scratch_bytes(int64_t n_assign, int n_experts);

// idx int32 [n_assign] expert of each assignment → perm int32 [n_assign]: assignment ids sorted by
// expert, stably; counts int32 [n_experts]: assignments per expert. keys_out int32 [n_assign] and
// ids int32 [n_assign] are scratch, scratch of sort_scratch_bytes.
void sort_by_expert(const int32_t* idx, int64_t n_assign, int n_experts, int32_t* perm,
                    int32_t* counts, int32_t* keys_out, int32_t* ids, void* scratch,
                    size_t scratch_bytes, cudaStream_t stream);

// xp bf16 [n_assign, d_model] ← y[perm[j] / top_k]; sp fp32 [n_assign] ← weight[perm[j]];
// inv int32 [n_assign]: inv[perm[j]] = j.
void gather_by_expert(const __nv_bfloat16* y, int64_t d_model, const int32_t* perm,
                      int64_t n_assign, int top_k, const float* weight, __nv_bfloat16* xp,
                      float* sp, int32_t* inv, cudaStream_t stream);

// out bf16 [n, d_model] ← acc[t] + Σ_k op[inv[t · top_k + k]] in fp32 (acc fp32 [n, d_model]: the
// shared expert's output; op bf16 [n · top_k, d_model]: the expert outputs, already weighted).
void combine_experts(const float* acc, const __nv_bfloat16* op, const int32_t* inv, int64_t n,
                     int top_k, int64_t d_model, __nv_bfloat16* out, cudaStream_t stream);
// The same with the shared expert's output in bf16 [n, d_model] (its rows of op when it runs as
// expert E of the fp8 experts): the same fp32 sum, shared[t] first.
void combine_experts(const __nv_bfloat16* shared, const __nv_bfloat16* op, const int32_t* inv,
                     int64_t n, int top_k, int64_t d_model, __nv_bfloat16* out,
                     cudaStream_t stream);

}  // namespace cpfill::ops::cuda
