// RMSNorm on the GPU: bf16 rows in and out, statistics in fp32 (docs/design.md §3), optionally with
// the interleaved partial RoPE of ops/cuda/rope.h applied in the same pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// y[rows, n] = x / sqrt(mean(x²) + eps) (· w[n] when w != nullptr, fp32 weights); y may alias x.
void rmsnorm(const __nv_bfloat16* x, int64_t rows, int64_t n, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream);

// Each of the `heads` blocks of head_dim channels of each row normalised as rmsnorm does (w:
// fp32 [head_dim], or nullptr), then its last rope_dim channels rotated as apply_rope does
// (forward; rope_dim 0: no rotation; inv_freq fp32 [rope_dim / 2], pos int64 [rows]), in fp32,
// rounded to bf16 once. x rows of stride ldx, y of stride ldy (elements); y may alias x.
struct NormRope {
    int heads = 1;
    int head_dim = 0;
    const float* w = nullptr;
    float eps = 1e-6f;
    int rope_dim = 0;
    const float* inv_freq = nullptr;
    const int64_t* pos = nullptr;
};
void rmsnorm_rope(const __nv_bfloat16* x, int64_t ldx, __nv_bfloat16* y, int64_t ldy, int64_t rows,
                  const NormRope& p, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
