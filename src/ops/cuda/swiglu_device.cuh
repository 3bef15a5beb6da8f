// The SwiGLU of one channel on the GPU (docs/architecture.md §3.8), shared by the bf16 SwiGLU
// (moe.cu), the SwiGLU + quantisation (moe_fp8.cu) and the grouped fp8 GEMM's fused epilogue
// (grouped_fp8.cu): one definition, so the fused and separate fp8 paths give the same bits.
#pragma once

namespace cpfill::ops::cuda {

// silu(min(g, limit)) · clamp(u, ±limit) · rs; limit ≤ 0: no clamp. rs: the row's scale (the
// routing weight of an expert's row, 1 for the shared expert).
__device__ __forceinline__ float swiglu_one(float g, float u, float limit, float rs) {
    if (limit > 0.0f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return g / (1.0f + expf(-g)) * u * rs;
}

}  // namespace cpfill::ops::cuda
