// Device helpers shared by the mHC kernels (mhc.cu: mhc_pre, mhc_post, mhc_head; mhc_fused.cu:
// mhc_post_pre): block shape, the per-token site math (sigmoid, Sinkhorn) of docs/architecture.md
// §3.3, the residual's loads and stores (fp32 or bf16) and the hc dispatch. Included by those two
// files only; everything is internal to each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"

namespace cpfill::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 4;  // tokens per block in mhc_pre / mhc_head

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Softmax over each row, + eps, then column / row normalisations (docs/architecture.md §3.3 step
// 6). c: [HC, HC] logits in, Sinkhorn-projected mix out.
template <int HC>
__device__ void sinkhorn(float (&c)[HC * HC], int iters, float eps) {
#pragma unroll
    for (int j = 0; j < HC; ++j) {
        float mx = c[j * HC];
#pragma unroll
        for (int k = 1; k < HC; ++k) mx = fmaxf(mx, c[j * HC + k]);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < HC; ++k) sum += (c[j * HC + k] = expf(c[j * HC + k] - mx));
#pragma unroll
        for (int k = 0; k < HC; ++k) c[j * HC + k] = c[j * HC + k] / sum + eps;
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {  // rows (all but the first round)
#pragma unroll
            for (int j = 0; j < HC; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < HC; ++k) s += c[j * HC + k];
#pragma unroll
                for (int k = 0; k < HC; ++k) c[j * HC + k] /= (s + eps);
            }
        }
#pragma unroll
        for (int k = 0; k < HC; ++k) {  // columns
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < HC; ++j) s += c[j * HC + k];
#pragma unroll
            for (int j = 0; j < HC; ++j) c[j * HC + k] /= (s + eps);
        }
    }
}

// The per-token site math (docs/architecture.md §3.3 steps 1–3) from the raw dot products mix =
// fn · h[t] (kMix values, then Σ h[t]² at mix[kMix]): fn · rmsnorm(h) = (fn · h) · rsqrt(mean(h²)
// + eps). pre [HC] out; unless kHead, post fp32 [.., HC] and comb fp32 [.., HC, HC] at row t.
template <int HC, bool kHead>
__device__ void site_weights(const float* mix, int64_t width, const float* base, const float* scale,
                             int sinkhorn_iters, float hc_eps, float norm_eps, float* pre,
                             float* post, float* comb, int64_t t) {
    constexpr int kMix = kHead ? HC : (2 + HC) * HC;
    const float rs = rsqrtf(mix[kMix] / static_cast<float>(width) + norm_eps);
#pragma unroll
    for (int j = 0; j < HC; ++j) pre[j] = sigmoid(mix[j] * rs * scale[0] + base[j]) + hc_eps;
    if constexpr (!kHead) {
#pragma unroll
        for (int j = 0; j < HC; ++j)
            post[t * HC + j] = 2.0f * sigmoid(mix[HC + j] * rs * scale[1] + base[HC + j]);
        float c[HC * HC];
#pragma unroll
        for (int i = 0; i < HC * HC; ++i) c[i] = mix[2 * HC + i] * rs * scale[2] + base[2 * HC + i];
        sinkhorn<HC>(c, sinkhorn_iters, hc_eps);
#pragma unroll
        for (int i = 0; i < HC * HC; ++i) comb[t * HC * HC + i] = c[i];
    }
}

// Σ_j pre[j] · a[j], j = 0 … HC-1 in that order from 0: four channels of a collapse, from the
// HC streams' float4 at those channels.
template <int HC>
__device__ __forceinline__ float4 combine4(const float4 (&a)[HC], const float* pre) {
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
        s.x += pre[j] * a[j].x;
        s.y += pre[j] * a[j].y;
        s.z += pre[j] * a[j].z;
        s.w += pre[j] * a[j].w;
    }
    return s;
}

// The residual h is fp32 or bf16 (mhc.h); the kernels are templates over its element type H and
// compute in fp32. Four consecutive values as fp32 (one 16- or 8-byte load: 4 · sizeof(H)-byte
// aligned), the same stored (the values must be what H holds: h_round4 first), one value, and a
// value rounded to what H holds (to nearest even; fp32: itself).
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Two floats rounded to bf16, as stored (the first in the low half).
__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float4 bf16x4_float4(uint2 v) {
    return make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
}

__device__ __forceinline__ float4 h_load4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 h_load4(const __nv_bfloat16* p) {
    return bf16x4_float4(*reinterpret_cast<const uint2*>(p));
}
__device__ __forceinline__ void h_store4(float* p, float4 v) {
    __stwb(reinterpret_cast<float4*>(p), v);  // a plain store, kept one 16-byte access
}
__device__ __forceinline__ void h_store4(__nv_bfloat16* p, float4 v) {
    __stwb(reinterpret_cast<uint2*>(p), make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w)));
}
__device__ __forceinline__ float h_get(const float* p) { return *p; }
__device__ __forceinline__ float h_get(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void h_put(float* p, float v) { *p = v; }
__device__ __forceinline__ void h_put(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

template <class H>
__device__ __forceinline__ float h_round(float v) {
    if constexpr (std::is_same_v<H, float>)
        return v;
    else
        return __bfloat162float(__float2bfloat16(v));
}
template <class H>
__device__ __forceinline__ float4 h_round4(float4 v) {
    return make_float4(h_round<H>(v.x), h_round<H>(v.y), h_round<H>(v.z), h_round<H>(v.w));
}

// Σ_j pre[j] · h[t, j, 4d … 4d+3] (ht = h[t]; vector loads): four channels of a collapse.
template <int HC, class H>
__device__ __forceinline__ float4 collapse4(const H* ht, int64_t d_model, int64_t d,
                                            const float* pre) {
    float4 a[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) a[j] = h_load4(ht + j * d_model + 4 * d);
    return combine4<HC>(a, pre);
}

inline bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Calls f(std::integral_constant<int, hc>) for hc ∈ [1, 4].
template <class F>
void dispatch_hc(int hc, F&& f) {
    switch (hc) {
        case 1:
            f(std::integral_constant<int, 1>{});
            break;
        case 2:
            f(std::integral_constant<int, 2>{});
            break;
        case 3:
            f(std::integral_constant<int, 3>{});
            break;
        case 4:
            f(std::integral_constant<int, 4>{});
            break;
        default:
            CPFILL_FAIL("mHC on CUDA: hc_mult {} is not supported (1 to 4)", hc);
    }
}

}  // namespace
}  // namespace cpfill::ops::cuda
