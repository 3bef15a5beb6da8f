// rmsnorm: one block per row; fp32 sum of squares reduced across the block.
#include "ops/cuda/norm.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(const __nv_bfloat16* x, int64_t n, const float* w, float eps,
                               __nv_bfloat16* y) {
    const __nv_bfloat16* xr = x + blockIdx.x * n;
    __nv_bfloat16* yr = y + blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    __shared__ float partial[kThreads / 32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / static_cast<float>(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __bfloat162float(xr[i]) * scale;
        yr[i] = __float2bfloat16(w ? w[i] * v : v);
    }
}

}  // namespace

void rmsnorm(const __nv_bfloat16* x, int64_t rows, int64_t n, const float* w, float eps,
             __nv_bfloat16* y, cudaStream_t stream) {
    if (rows == 0) return;
    rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, w, eps, y);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
