// RMSNorm on the GPU: bf16 rows in and out, statistics in fp32 (docs/design.md §3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// y[rows, n] = x / sqrt(mean(x²) + eps) (· w[n] when w != nullptr, fp32 weights); y may alias x.
void rmsnorm(const __nv_bfloat16* x, int64_t rows, int64_t n, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
