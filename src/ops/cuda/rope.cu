// apply_rope: one thread per (row, head, pair).
#include "ops/cuda/rope.h"
#include "ops/cuda/rope_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

__global__ void rope_kernel(__nv_bfloat16* x, int64_t rows, int64_t ld, int heads, int head_dim,
                            int half, const float* inv_freq, const int64_t* pos, bool inverse) {
    const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t total = rows * heads * half;
    if (idx >= total) return;
    const int j = static_cast<int>(idx % half);
    const int h = static_cast<int>((idx / half) % heads);
    const int64_t r = idx / (static_cast<int64_t>(half) * heads);
    float c, s;
    rope_device::cos_sin(inv_freq, j, static_cast<float>(pos[r]), inverse, c, s);
    __nv_bfloat16* v = x + r * ld + static_cast<int64_t>(h) * head_dim + head_dim - 2 * half;
    float a = __bfloat162float(v[2 * j]), b = __bfloat162float(v[2 * j + 1]);
    rope_device::rotate(a, b, c, s);
    v[2 * j] = __float2bfloat16(a);
    v[2 * j + 1] = __float2bfloat16(b);
}

}  // namespace

void apply_rope(__nv_bfloat16* x, int64_t rows, int64_t ld, int heads, int head_dim, int rope_dim,
                const float* inv_freq, const int64_t* pos, bool inverse, cudaStream_t stream) {
    const int half = rope_dim / 2;
    const int64_t total = rows * heads * half;
    if (total == 0) return;
    const int threads = 256;
    const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
    rope_kernel<<<blocks, threads, 0, stream>>>(x, rows, ld, heads, head_dim, half, inv_freq, pos,
                                                inverse);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
