// Device helpers shared by the mHC kernels (mhc.cu: mhc_pre, mhc_post, mhc_head; mhc_fused.cu:
// mhc_post_pre): block shape, the per-token site math (sigmoid, Sinkhorn) of docs/architecture.md
// §3.3, and the hc dispatch. Included by those two files only; everything is internal to each.
#pragma once

#include <cuda_bf16.h>

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

// Σ_j pre[j] · h[t, j, 4d … 4d+3] (float4 loads; d4 = d_model / 4): four channels of a collapse.
template <int HC>
__device__ __forceinline__ float4 collapse4(const float4* ht4, int64_t d4, int64_t d,
                                            const float* pre) {
    float4 a[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) a[j] = ht4[j * d4 + d];
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
