// MoE permutation: counting, a stable radix sort by expert (CUB), gather and combine kernels.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/moe_dispatch.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
    return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20));
}

int key_bits(int n_experts) {
    int bits = 1;
    while ((1 << bits) < n_experts) ++bits;
    return bits;
}

__global__ void iota_count_kernel(const int32_t* idx, int64_t n, int32_t* ids, int32_t* counts) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        ids[i] = static_cast<int32_t>(i);
        atomicAdd(&counts[idx[i]], 1);
    }
}

// One block per assignment row; 8 bf16 per thread when d_model allows.
__global__ void gather_kernel(const __nv_bfloat16* y, int64_t d, const int32_t* perm, int top_k,
                              const float* weight, __nv_bfloat16* xp, float* sp, int32_t* inv) {
    const int64_t j = blockIdx.x;
    const int32_t a = perm[j];
    if (threadIdx.x == 0) {
        sp[j] = weight[a];
        inv[a] = static_cast<int32_t>(j);
    }
    const __nv_bfloat16* src = y + int64_t{a / top_k} * d;
    __nv_bfloat16* dst = xp + j * d;
    if (d % 8 == 0) {
        const int4* s4 = reinterpret_cast<const int4*>(src);
        int4* d4 = reinterpret_cast<int4*>(dst);
        for (int64_t c = threadIdx.x; c < d / 8; c += blockDim.x) d4[c] = s4[c];
    } else {
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
    }
}

// The shared expert's value of element i: fp32 (its own GEMM's output) or bf16 (its rows of the
// expert outputs).
__device__ __forceinline__ float shared_at(const float* acc, int64_t i) { return acc[i]; }
__device__ __forceinline__ float shared_at(const __nv_bfloat16* acc, int64_t i) {
    return __bfloat162float(acc[i]);
}

template <class Acc>
__global__ void combine_kernel(const Acc* acc, const __nv_bfloat16* op, const int32_t* inv,
                               int top_k, int64_t d, __nv_bfloat16* out) {
    const int64_t t = blockIdx.x;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float s = shared_at(acc, t * d + c);
        for (int k = 0; k < top_k; ++k)
            s += __bfloat162float(op[int64_t{inv[t * top_k + k]} * d + c]);
        out[t * d + c] = __float2bfloat16_rn(s);
    }
}

// Eight values of the shared expert's output from 16-byte loads.
__device__ __forceinline__ void shared8(const float* acc, float (&s)[8]) {
    const float4 a0 = *reinterpret_cast<const float4*>(acc);
    const float4 a1 = *reinterpret_cast<const float4*>(acc + 4);
    s[0] = a0.x, s[1] = a0.y, s[2] = a0.z, s[3] = a0.w;
    s[4] = a1.x, s[5] = a1.y, s[6] = a1.z, s[7] = a1.w;
}
__device__ __forceinline__ void shared8(const __nv_bfloat16* acc, float (&s)[8]) {
    const uint4 v = *reinterpret_cast<const uint4*>(acc);
    const auto* v2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(v2[j]);
        s[2 * j] = f.x;
        s[2 * j + 1] = f.y;
    }
}

// Channels c … c + 7 of row t (16-byte loads).
template <class Acc>
__device__ __forceinline__ void combine8(const Acc* acc, const __nv_bfloat16* op,
                                         const int32_t* inv, int top_k, int64_t d, int64_t t,
                                         int64_t c, __nv_bfloat16* out) {
    float s[8];
    shared8(acc + t * d + c, s);
    for (int k = 0; k < top_k; ++k) {
        const uint4 v = *reinterpret_cast<const uint4*>(op + int64_t{inv[t * top_k + k]} * d + c);
        const auto* v2 = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(v2[j]);
            s[2 * j] += f.x;
            s[2 * j + 1] += f.y;
        }
    }
    uint4 o;
    auto* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) o2[j] = __floats2bfloat162_rn(s[2 * j], s[2 * j + 1]);
    *reinterpret_cast<uint4*>(out + t * d + c) = o;
}

// A thread per 8 channels of a row, grid-stride: d a multiple of 8.
template <class Acc>
__global__ void combine8_kernel(const Acc* acc, const __nv_bfloat16* op, const int32_t* inv,
                                int top_k, int64_t d, int64_t n, __nv_bfloat16* out) {
    const int64_t groups = d / 8;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * groups;
         i += int64_t{gridDim.x} * blockDim.x) {
        combine8(acc, op, inv, top_k, d, i / groups, (i % groups) * 8, out);
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

size_t sort_scratch_bytes(int64_t n_assign, int n_experts) {
    size_t bytes = 0;
    CPFILL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<int>(n_assign), 0, key_bits(n_experts)));
    return bytes;
}

void sort_by_expert(const int32_t* idx, int64_t n_assign, int n_experts, int32_t* perm,
                    int32_t* counts, int32_t* keys_out, int32_t* ids, void* scratch,
                    size_t scratch_bytes, cudaStream_t stream) {
    CPFILL_CUDA_CHECK(cudaMemsetAsync(counts, 0, n_experts * sizeof(int32_t), stream));
    if (n_assign == 0) return;
    iota_count_kernel<<<blocks_for(n_assign), kThreads, 0, stream>>>(idx, n_assign, ids, counts);
    CPFILL_CUDA_CHECK(cudaGetLastError());
    size_t bytes = scratch_bytes;
    CPFILL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, bytes, idx, keys_out, ids, perm,
                                                      static_cast<int>(n_assign), 0,
                                                      key_bits(n_experts), stream));
}

void gather_by_expert(const __nv_bfloat16* y, int64_t d_model, const int32_t* perm,
                      int64_t n_assign, int top_k, const float* weight, __nv_bfloat16* xp,
                      float* sp, int32_t* inv, cudaStream_t stream) {
    if (n_assign == 0) return;
    gather_kernel<<<static_cast<unsigned>(n_assign), 128, 0, stream>>>(y, d_model, perm, top_k,
                                                                       weight, xp, sp, inv);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

namespace {

template <class Acc>
void combine_any(const Acc* acc, const __nv_bfloat16* op, const int32_t* inv, int64_t n, int top_k,
                 int64_t d_model, __nv_bfloat16* out, cudaStream_t stream) {
    if (n == 0) return;
    if (d_model % 8 == 0 && aligned16(acc) && aligned16(op) && aligned16(out)) {
        combine8_kernel<<<blocks_for(n * (d_model / 8)), kThreads, 0, stream>>>(acc, op, inv, top_k,
                                                                                d_model, n, out);
    } else {
        combine_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(acc, op, inv, top_k, d_model,
                                                                     out);
    }
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void combine_experts(const float* acc, const __nv_bfloat16* op, const int32_t* inv, int64_t n,
                     int top_k, int64_t d_model, __nv_bfloat16* out, cudaStream_t stream) {
    combine_any(acc, op, inv, n, top_k, d_model, out, stream);
}

void combine_experts(const __nv_bfloat16* shared, const __nv_bfloat16* op, const int32_t* inv,
                     int64_t n, int top_k, int64_t d_model, __nv_bfloat16* out,
                     cudaStream_t stream) {
    combine_any(shared, op, inv, n, top_k, d_model, out, stream);
}

}  // namespace cpfill::ops::cuda
