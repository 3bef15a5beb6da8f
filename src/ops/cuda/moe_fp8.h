// The routed experts' activations in fp8 (docs/fp8.md): the gather by expert and the SwiGLU write
// e4m3 with one fp32 scale per (row, 128 channels) themselves, no separate pass. cuBLASLt's
// block-scaled GEMM needs a multiple of 4 rows and each GEMM its own contiguous activation scales,
// so every expert's rows start at a multiple of kExpertRowAlign ("padded rows": pad rows are zeros
// with scale 1 and routing weight 0) and its scales form one [K/128][m4] block at
// pfirst[e] · K/128 (m4: its padded row count).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

constexpr int kExpertRowAlign = 4;

// Rows of expert e's padded block (on the host for the padded offsets, pfirst [E + 1], from the
// counts, and in expert_offsets on the device: the same numbers).
__host__ __device__ inline int64_t padded_rows(int64_t count) {
    return (count + kExpertRowAlign - 1) / kExpertRowAlign * kExpertRowAlign;
}
// Most padded rows n_assign assignments over n_experts experts can take.
inline int64_t max_padded_rows(int64_t n_assign, int n_experts) {
    return n_assign + int64_t{kExpertRowAlign - 1} * n_experts;
}

// counts int32 [E] → first int32 [E + 1] (prefix sums: the sorted assignments of each expert) and
// pfirst int32 [E + 1] (prefix sums of the padded counts). One block; E ≤ 1024.
// shared_rows > 0: the shared expert follows as expert E with shared_rows rows (every token of the
// batch, docs/fp8.md "The shared expert as expert E"): first and pfirst then hold E + 2 entries,
// first[E + 1] = first[E] + shared_rows, pfirst[E + 1] = pfirst[E] + padded_rows(shared_rows).
void expert_offsets(const int32_t* counts, int n_experts, int32_t* first, int32_t* pfirst,
                    cudaStream_t stream, int64_t shared_rows = 0);

// For every padded row p < n_pad (= pfirst[E]): the assignment a = perm[first[e] + i] of expert e
// (i = p − pfirst[e] < counts[e]) → xq e4m3 [n_pad, d_model] ← y[a / top_k] quantised, its scales
// at xs[pfirst[e] · d_model/128 + kb · m4 + i], sp[p] ← weight[a], inv[a] ← p; pad rows zeros,
// scale 1, sp 0. d_model a multiple of 128.
// shared_rows > 0 (pfirst of expert_offsets with the same shared_rows; n_pad = pfirst[E + 1]): the
// rows of expert E are y's rows 0 … shared_rows − 1 in order, quantised the same way, sp 1 (its pad
// rows as above); inv is not written for them.
void gather_quant_fp8(const __nv_bfloat16* y, int64_t d_model, const int32_t* perm, int top_k,
                      const float* weight, const int32_t* counts, const int32_t* first,
                      const int32_t* pfirst, int n_experts, int64_t n_pad, void* xq, float* xs,
                      float* sp, int32_t* inv, cudaStream_t stream, int64_t shared_rows = 0);

// One expert's padded block of m4 rows: gate_up bf16 [m4, 2 · width] → act = silu(min(gate,
// limit)) · clamp(up, ±limit) · row_scale[r] (ops/cuda/moe.h swiglu, without its bf16 rounding),
// quantised: aq e4m3 [m4, width], as [width/128][m4]. width a multiple of 128.
void swiglu_quant_fp8(const __nv_bfloat16* gate_up, int64_t m4, int64_t width, float limit,
                      const float* row_scale, void* aq, float* as, cudaStream_t stream);

// swiglu_quant_fp8 over the padded rows of all experts in one launch: gate_up [n_pad, 2 · width],
// row_scale [n_pad] (sp of gather_quant_fp8), expert e's scales at as + pfirst[e] · width/128.
void swiglu_quant_fp8_experts(const __nv_bfloat16* gate_up, int64_t n_pad, int64_t width,
                              float limit, const float* row_scale, const int32_t* pfirst,
                              int n_experts, void* aq, float* as, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
