// mHC kernels. mhc_pre / mhc_head: one block per kRows tokens, so each fn element read from L2
// serves kRows tokens; every thread accumulates the kRows × (mixes + 1) partial dot products and
// sums of squares over a strided slice of the flattened streams, then a block reduction, the
// per-token sigmoid / Sinkhorn math (one thread per token, a few hundred flops) and the collapse.
// float4 loads where d_model % 4 == 0. mhc_post: one thread per (token, channel), all hc streams
// in registers.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/mhc.h"
#include "ops/cuda/mhc_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

// kHead: hc_head (pre weights only). Otherwise the layer site: pre, post and comb.
// kVec: float4 loads of h and fn (d_model % 4 == 0 and aligned pointers), else scalar.
// kPre: the mixes come precomputed in `mixed` [rows, kMix]; only the sums of squares are taken.
template <int HC, bool kHead, bool kVec, bool kPre = false>
__global__ void __launch_bounds__(kThreads)
    mhc_collapse_kernel(const float* fn, const float* base, const float* scale, int64_t d_model,
                        int64_t rows, int sinkhorn_iters, float hc_eps, float norm_eps,
                        const float* h, float* post, float* comb, __nv_bfloat16* x,
                        const float* mixed = nullptr) {
    constexpr int kMix = kHead ? HC : (2 + HC) * HC;
    constexpr int kVals = kMix + 1;  // the mixes, then the sum of squares
    const int64_t width = HC * d_model;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int n_rows = static_cast<int>(rows - row0 < kRows ? rows - row0 : kRows);
    const float* hb = h + row0 * width;

    float acc[kRows][kVals];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < kVals; ++m) acc[r][m] = 0.0f;
    if constexpr (kVec) {  // 4 channels per load: d_model % 4 == 0, 16-byte aligned h and fn
        const float4* h4 = reinterpret_cast<const float4*>(hb);
        const float4* fn4 = reinterpret_cast<const float4*>(fn);
        const int64_t w4 = width / 4;
        for (int64_t i = threadIdx.x; i < w4; i += kThreads) {
            float4 v[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                v[r] = r < n_rows ? h4[r * w4 + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                acc[r][kMix] +=
                    v[r].x * v[r].x + v[r].y * v[r].y + v[r].z * v[r].z + v[r].w * v[r].w;
            }
            if constexpr (!kPre) {
#pragma unroll
                for (int m = 0; m < kMix; ++m) {
                    const float4 f = __ldg(fn4 + m * w4 + i);
#pragma unroll
                    for (int r = 0; r < kRows; ++r)
                        acc[r][m] += f.x * v[r].x + f.y * v[r].y + f.z * v[r].z + f.w * v[r].w;
                }
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < width; i += kThreads) {
            float v[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                v[r] = r < n_rows ? hb[r * width + i] : 0.0f;
                acc[r][kMix] += v[r] * v[r];
            }
            if constexpr (!kPre) {
#pragma unroll
                for (int m = 0; m < kMix; ++m) {
                    const float f = __ldg(fn + m * width + i);
#pragma unroll
                    for (int r = 0; r < kRows; ++r) acc[r][m] += f * v[r];
                }
            }
        }
    }

    __shared__ float partial[kWarps][kRows * kVals];
    __shared__ float total[kRows * kVals];
    __shared__ float pre[kRows][HC];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < kVals; ++m) {
            const float s = warp_sum(acc[r][m]);
            if (lane == 0) partial[warp][r * kVals + m] = s;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * kVals; i += kThreads) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += partial[w][i];
        const int r = i / kVals, m = i % kVals;
        if (kPre && m < kMix) s = r < n_rows ? mixed[(row0 + r) * kMix + m] : 0.0f;
        total[i] = s;
    }
    __syncthreads();

    if (threadIdx.x < n_rows)
        site_weights<HC, kHead>(total + threadIdx.x * kVals, width, base, scale, sinkhorn_iters,
                                hc_eps, norm_eps, pre[threadIdx.x], post, comb, row0 + threadIdx.x);
    __syncthreads();

    for (int r = 0; r < n_rows; ++r) {
        const float* ht = hb + r * width;
        __nv_bfloat16* xt = x + (row0 + r) * d_model;
        if constexpr (kVec) {
            const float4* ht4 = reinterpret_cast<const float4*>(ht);
            __nv_bfloat162* xt2 = reinterpret_cast<__nv_bfloat162*>(xt);
            const int64_t d4 = d_model / 4;
            for (int64_t d = threadIdx.x; d < d4; d += kThreads) {
                const float4 s = collapse4<HC>(ht4, d4, d, pre[r]);
                xt2[2 * d] = __floats2bfloat162_rn(s.x, s.y);
                xt2[2 * d + 1] = __floats2bfloat162_rn(s.z, s.w);
            }
        } else {
            for (int64_t d = threadIdx.x; d < d_model; d += kThreads) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < HC; ++j) s += pre[r][j] * ht[j * d_model + d];
                xt[d] = __float2bfloat16(s);
            }
        }
    }
}

template <int HC>
__global__ void mhc_post_kernel(const float* post, const float* comb, const __nv_bfloat16* o,
                                int64_t d_model, int64_t rows, float* h) {
    const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (idx >= rows * d_model) return;
    const int64_t t = idx / d_model, d = idx % d_model;
    float* ht = h + t * HC * d_model + d;
    const float* ct = comb + t * HC * HC;
    float old[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) old[j] = ht[j * d_model];
    const float ov = __bfloat162float(o[idx]);
#pragma unroll
    for (int k = 0; k < HC; ++k) {
        float s = __ldg(post + t * HC + k) * ov;
#pragma unroll
        for (int j = 0; j < HC; ++j) s += __ldg(ct + j * HC + k) * old[j];
        ht[k * d_model] = s;
    }
}

// ---- mhc_post_pre (see the file header) ----

template <int HC, bool kHead>
void launch_collapse(const float* fn, const float* base, const float* scale, int64_t d_model,
                     int64_t rows, int iters, float hc_eps, float norm_eps, const float* h,
                     float* post, float* comb, __nv_bfloat16* x, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>((rows + kRows - 1) / kRows);
    if (d_model % 4 == 0 && aligned(h, 16) && aligned(fn, 16) && aligned(x, 8))
        mhc_collapse_kernel<HC, kHead, true><<<blocks, kThreads, 0, stream>>>(
            fn, base, scale, d_model, rows, iters, hc_eps, norm_eps, h, post, comb, x);
    else
        mhc_collapse_kernel<HC, kHead, false><<<blocks, kThreads, 0, stream>>>(
            fn, base, scale, d_model, rows, iters, hc_eps, norm_eps, h, post, comb, x);
}

template <int HC>
void launch_pre_mixed(const MhcDeviceParams& p, int64_t rows, const float* h, float* post,
                      float* comb, __nv_bfloat16* x, const float* mixes, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>((rows + kRows - 1) / kRows);
    if (p.d_model % 4 == 0 && aligned(h, 16) && aligned(x, 8))
        mhc_collapse_kernel<HC, false, true, true><<<blocks, kThreads, 0, stream>>>(
            p.fn, p.base, p.scale, p.d_model, rows, p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, post,
            comb, x, mixes);
    else
        mhc_collapse_kernel<HC, false, false, true><<<blocks, kThreads, 0, stream>>>(
            p.fn, p.base, p.scale, p.d_model, rows, p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, post,
            comb, x, mixes);
}

}  // namespace

void mhc_pre(const MhcDeviceParams& p, const float* h, int64_t rows, float* post, float* comb,
             __nv_bfloat16* x, GemmContext& gemm, float* mixes, cudaStream_t stream) {
    if (rows == 0) return;
    CPFILL_CHECK(p.sinkhorn_iters >= 1, "mhc_pre: hc_sinkhorn_iters must be ≥ 1, found {}",
                 p.sinkhorn_iters);
    const int64_t n_mix = int64_t{2 + p.hc} * p.hc, width = p.hc * p.d_model;
    gemm_f32(gemm, h, width, rows, width, p.fn, n_mix, mixes, n_mix, stream);
    dispatch_hc(p.hc, [&](auto hc) {
        launch_pre_mixed<decltype(hc)::value>(p, rows, h, post, comb, x, mixes, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, float* h, cudaStream_t stream) {
    const int64_t total = rows * d_model;
    if (total == 0) return;
    const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
    dispatch_hc(hc, [&](auto c) {
        mhc_post_kernel<decltype(c)::value>
            <<<blocks, kThreads, 0, stream>>>(post, comb, o, d_model, rows, h);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream) {
    if (rows == 0) return;
    dispatch_hc(hc, [&](auto c) {
        launch_collapse<decltype(c)::value, true>(fn, base, scale, d_model, rows, 0, hc_eps,
                                                  norm_eps, h, nullptr, nullptr, z, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
