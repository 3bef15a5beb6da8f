// mHC on the GPU (docs/architecture.md §3.3, §3.9): the same three steps as ops/mhc.h, fp32 math
// throughout (docs/design.md §3).
//
// The residual state h stays fp32 on the GPU: [rows, hc, d_model], stream-major per token. It is
// summed into 61 times per stream (Pro) through Sinkhorn mixes; bf16 would round every update to
// 8 bits of mantissa, fp32 keeps it at the CPU reference's precision for 4·d_model·4 bytes per
// token. Sub-block inputs (x, z) and outputs (o) are bf16, like every other activation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemm.h"

namespace cpfill::ops::cuda {

// Device pointers; the fields mean what they mean in ops::MhcParams. hc ∈ [1, 4].
struct MhcDeviceParams {
    const float* fn;     // fp32 [(2 + hc) · hc, hc · d_model]
    const float* base;   // fp32 [(2 + hc) · hc]
    const float* scale;  // fp32 [3]
    int hc;
    int64_t d_model;
    int sinkhorn_iters;
    float hc_eps;
    float norm_eps;
};

// Per row of h (fp32 [rows, hc, d_model]): post fp32 [rows, hc], comb fp32 [rows, hc, hc] (Sinkhorn
// projected, comb[j, k] mixes stream j into stream k) and the collapse x bf16 [rows, d_model] =
// Σ_j pre_j · h[j]. The (2 + hc)·hc mixing dot products are one fp32 cuBLASLt GEMM over all rows
// (mixes fp32 [rows, (2 + hc)·hc] scratch); then one kernel adds the sums of squares, the
// per-token sigmoid / softmax / Sinkhorn and the collapse. (A variant that did the dot products
// in that kernel re-read fn from L2 for every 4 tokens, ≈ 6 × the bytes of h; it was removed in
// stop 18, kept alive only by its test. mhc_head still does its hc products so.)
void mhc_pre(const MhcDeviceParams& p, const float* h, int64_t rows, float* post, float* comb,
             __nv_bfloat16* x, GemmContext& gemm, float* mixes, cudaStream_t stream);

// h[t, k] ← post_k · o[t] + Σ_j comb[j, k] · h[t, j], in place. post fp32 [rows, hc], comb fp32
// [rows, hc, hc], o bf16 [rows, d_model], h fp32 [rows, hc, d_model].
void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, float* h, cudaStream_t stream);

// Final head collapse: z[t] = Σ_j (sigmoid(scale · (fn · rmsnorm(h[t]))_j + base_j) + hc_eps) h[t,
// j]. fn fp32 [hc, hc · d_model], base fp32 [hc], scale fp32 [1] (device); z bf16 [rows, d_model].
void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream);

}  // namespace cpfill::ops::cuda
