// rmsnorm and rmsnorm_rope. Rows (or head blocks) of 128 · {1, 2, 4, 8} channels: one warp each,
// the values held in registers between the sum of squares and the store (one read, one write),
// 8-byte loads of 4 channels per lane. Other widths: one warp per head block reading it twice
// (rmsnorm_rope), or one block per row (rmsnorm: d_model-wide rows).
#include "ops/cuda/norm.h"
#include "ops/cuda/rope_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Rotates channels (c, c + 1) of a head block when c lies in its last rope_dim channels.
__device__ __forceinline__ void rotate(float& a, float& b, int c, const NormRope& p, float fpos) {
    const int r0 = p.head_dim - p.rope_dim;
    if (p.rope_dim == 0 || c < r0) return;
    float co, s;
    rope_device::cos_sin(p.inv_freq, (c - r0) / 2, fpos, false, co, s);
    rope_device::rotate(a, b, co, s);
}

// One warp per (row, head): lane l holds channels 4 (32 i + l) … + 3 for i < kVec.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
    norm_rope_kernel(const bf16* x, int64_t ldx, bf16* y, int64_t ldy, int64_t items, NormRope p) {
    const int64_t item = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (item >= items) return;  // whole warps
    const int64_t r = item / p.heads;
    const int64_t off = (item % p.heads) * int64_t{p.head_dim};
    const bf16* xr = x + r * ldx + off;
    float v[kVec][4];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        const uint2 raw = *reinterpret_cast<const uint2*>(xr + (i * 32 + lane) * 4);
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
        v[i][0] = lo.x;
        v[i][1] = lo.y;
        v[i][2] = hi.x;
        v[i][3] = hi.y;
        ss += lo.x * lo.x + lo.y * lo.y + hi.x * hi.x + hi.y * hi.y;
    }
    const float scale = rsqrtf(warp_sum(ss) / static_cast<float>(p.head_dim) + p.eps);
    const float fpos = p.rope_dim > 0 ? static_cast<float>(p.pos[r]) : 0.0f;
    bf16* yr = y + r * ldy + off;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        const int c = (i * 32 + lane) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            v[i][e] *= scale;
            if (p.w) v[i][e] = p.w[c + e] * v[i][e];
        }
        rotate(v[i][0], v[i][1], c, p, fpos);
        rotate(v[i][2], v[i][3], c + 2, p, fpos);
        uint2 raw;
        *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v[i][0], v[i][1]);
        *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v[i][2], v[i][3]);
        *reinterpret_cast<uint2*>(yr + c) = raw;
    }
}

// Any head_dim: one warp per (row, head), the block read twice (sum of squares, then the update;
// y may alias x, so the update reads x before writing y element by element or pair by pair).
__global__ void norm_rope_any_kernel(const bf16* x, int64_t ldx, bf16* y, int64_t ldy,
                                     int64_t items, NormRope p) {
    const int64_t item = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (item >= items) return;
    const int64_t r = item / p.heads;
    const int64_t off = (item % p.heads) * int64_t{p.head_dim};
    const bf16* xr = x + r * ldx + off;
    bf16* yr = y + r * ldy + off;
    float ss = 0.0f;
    for (int c = lane; c < p.head_dim; c += 32) {
        const float v = __bfloat162float(xr[c]);
        ss += v * v;
    }
    const float scale = rsqrtf(warp_sum(ss) / static_cast<float>(p.head_dim) + p.eps);
    const auto normed = [&](int c) {
        const float v = __bfloat162float(xr[c]) * scale;
        return p.w ? p.w[c] * v : v;
    };
    const int r0 = p.head_dim - p.rope_dim;
    for (int c = lane; c < r0; c += 32) yr[c] = __float2bfloat16(normed(c));
    const float fpos = p.rope_dim > 0 ? static_cast<float>(p.pos[r]) : 0.0f;
    for (int c = r0 + 2 * lane; c < p.head_dim; c += 64) {
        float a = normed(c), b = normed(c + 1);
        rotate(a, b, c, p, fpos);
        yr[c] = __float2bfloat16(a);
        yr[c + 1] = __float2bfloat16(b);
    }
}

// One block per row (wide rows: d_model).
__global__ void rmsnorm_kernel(const bf16* x, int64_t n, const float* w, float eps, bf16* y) {
    const bf16* xr = x + blockIdx.x * n;
    bf16* yr = y + blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    __shared__ float partial[kWarps];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        const float v = warp_sum(threadIdx.x < kWarps ? partial[threadIdx.x] : 0.0f);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / static_cast<float>(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __bfloat162float(xr[i]) * scale;
        yr[i] = __float2bfloat16(w ? w[i] * v : v);
    }
}

bool aligned8(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 8 == 0; }

// The warp-per-block kernel for these widths, or nullptr.
using NormRopeKernel = void (*)(const bf16*, int64_t, bf16*, int64_t, int64_t, NormRope);
NormRopeKernel fast_kernel(int head_dim) {
    switch (head_dim) {
        case 128:
            return norm_rope_kernel<1>;
        case 256:
            return norm_rope_kernel<2>;
        case 512:
            return norm_rope_kernel<4>;
        case 1024:
            return norm_rope_kernel<8>;
        default:
            return nullptr;
    }
}

}  // namespace

void rmsnorm_rope(const bf16* x, int64_t ldx, bf16* y, int64_t ldy, int64_t rows, const NormRope& p,
                  cudaStream_t stream) {
    CPFILL_CHECK(p.heads >= 1 && p.head_dim >= 1 && p.rope_dim >= 0 && p.rope_dim % 2 == 0 &&
                     p.rope_dim <= p.head_dim,
                 "rmsnorm_rope: {} heads of {} channels, rope_dim {}", p.heads, p.head_dim,
                 p.rope_dim);
    CPFILL_CHECK(p.rope_dim == 0 || (p.inv_freq != nullptr && p.pos != nullptr),
                 "rmsnorm_rope: rope_dim {} without inv_freq or positions", p.rope_dim);
    const int64_t items = rows * p.heads;
    if (items == 0) return;
    const unsigned blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
    NormRopeKernel k = fast_kernel(p.head_dim);
    if (!k || !aligned8(x) || !aligned8(y) || ldx % 4 != 0 || ldy % 4 != 0)
        k = norm_rope_any_kernel;
    k<<<blocks, kThreads, 0, stream>>>(x, ldx, y, ldy, items, p);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(const bf16* x, int64_t rows, int64_t n, const float* w, float eps, bf16* y,
             cudaStream_t stream) {
    if (rows == 0) return;
    if (n <= 1024) {
        NormRope p;
        p.head_dim = static_cast<int>(n);
        p.w = w;
        p.eps = eps;
        rmsnorm_rope(x, n, y, n, rows, p, stream);
        return;
    }
    rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, w, eps, y);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
