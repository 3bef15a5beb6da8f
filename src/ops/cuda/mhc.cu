// mHC kernels. mhc_pre / mhc_head: one block per kRows tokens, so each fn element read from L2
// serves kRows tokens; every thread accumulates the kRows × (mixes + 1) partial dot products and
// sums of squares over a strided slice of the flattened streams, then a block reduction, the
// per-token sigmoid / Sinkhorn math (one thread per token, a few hundred flops) and the collapse.
// Vector loads where d_model % 4 == 0. mhc_post: one thread per (token, channel), all hc streams
// in registers. Each kernel is a template over the residual's element type H (fp32 or bf16,
// mhc.h); the arithmetic is fp32.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/mhc.h"
#include "ops/cuda/mhc_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

// kHead: hc_head (pre weights only). Otherwise the layer site: pre, post and comb.
// kVec: 4-value loads of h and fn (d_model % 4 == 0 and aligned pointers), else scalar.
// kPre: the mixes come precomputed in `mixed` [rows, kMix]; only the sums of squares are taken.
template <int HC, bool kHead, bool kVec, bool kPre, class H>
__global__ void __launch_bounds__(kThreads)
    mhc_collapse_kernel(const float* fn, const float* base, const float* scale, int64_t d_model,
                        int64_t rows, int sinkhorn_iters, float hc_eps, float norm_eps, const H* h,
                        float* post, float* comb, __nv_bfloat16* x, const float* mixed) {
    constexpr int kMix = kHead ? HC : (2 + HC) * HC;
    constexpr int kVals = kMix + 1;  // the mixes, then the sum of squares
    const int64_t width = HC * d_model;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int n_rows = static_cast<int>(rows - row0 < kRows ? rows - row0 : kRows);
    const H* hb = h + row0 * width;

    float acc[kRows][kVals];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < kVals; ++m) acc[r][m] = 0.0f;
    if constexpr (kVec) {  // 4 channels per load: d_model % 4 == 0, aligned h and fn
        const float4* fn4 = reinterpret_cast<const float4*>(fn);
        const int64_t w4 = width / 4;
        for (int64_t i = threadIdx.x; i < w4; i += kThreads) {
            float4 v[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                v[r] = r < n_rows ? h_load4(hb + r * width + 4 * i)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
                v[r] = r < n_rows ? h_get(hb + r * width + i) : 0.0f;
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
        const H* ht = hb + r * width;
        __nv_bfloat16* xt = x + (row0 + r) * d_model;
        if constexpr (kVec) {
            __nv_bfloat162* xt2 = reinterpret_cast<__nv_bfloat162*>(xt);
            const int64_t d4 = d_model / 4;
            for (int64_t d = threadIdx.x; d < d4; d += kThreads) {
                const float4 s = collapse4<HC>(ht, d_model, d, pre[r]);
                xt2[2 * d] = __floats2bfloat162_rn(s.x, s.y);
                xt2[2 * d + 1] = __floats2bfloat162_rn(s.z, s.w);
            }
        } else {
            for (int64_t d = threadIdx.x; d < d_model; d += kThreads) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < HC; ++j) s += pre[r][j] * h_get(ht + j * d_model + d);
                xt[d] = __float2bfloat16(s);
            }
        }
    }
}

template <int HC, class H>
__global__ void mhc_post_kernel(const float* post, const float* comb, const __nv_bfloat16* o,
                                int64_t d_model, int64_t rows, H* h) {
    const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (idx >= rows * d_model) return;
    const int64_t t = idx / d_model, d = idx % d_model;
    H* ht = h + t * HC * d_model + d;
    const float* ct = comb + t * HC * HC;
    float old[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) old[j] = h_get(ht + j * d_model);
    const float ov = __bfloat162float(o[idx]);
#pragma unroll
    for (int k = 0; k < HC; ++k) {
        float s = __ldg(post + t * HC + k) * ov;
#pragma unroll
        for (int j = 0; j < HC; ++j) s += __ldg(ct + j * HC + k) * old[j];
        h_put(ht + k * d_model, s);
    }
}

// ---- mhc_post_pre (see the file header) ----

// The dot products in the kernel: mhc_head (kHead), and mhc_pre with a bf16 h.
template <int HC, bool kHead, class H>
void launch_collapse(const float* fn, const float* base, const float* scale, int64_t d_model,
                     int64_t rows, int iters, float hc_eps, float norm_eps, const H* h, float* post,
                     float* comb, __nv_bfloat16* x, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>((rows + kRows - 1) / kRows);
    if (d_model % 4 == 0 && aligned(h, 4 * sizeof(H)) && aligned(fn, 16) && aligned(x, 8))
        mhc_collapse_kernel<HC, kHead, true, false, H><<<blocks, kThreads, 0, stream>>>(
            fn, base, scale, d_model, rows, iters, hc_eps, norm_eps, h, post, comb, x, nullptr);
    else
        mhc_collapse_kernel<HC, kHead, false, false, H><<<blocks, kThreads, 0, stream>>>(
            fn, base, scale, d_model, rows, iters, hc_eps, norm_eps, h, post, comb, x, nullptr);
}

template <int HC>
void launch_pre_mixed(const MhcDeviceParams& p, int64_t rows, const float* h, float* post,
                      float* comb, __nv_bfloat16* x, const float* mixes, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>((rows + kRows - 1) / kRows);
    if (p.d_model % 4 == 0 && aligned(h, 16) && aligned(x, 8))
        mhc_collapse_kernel<HC, false, true, true, float><<<blocks, kThreads, 0, stream>>>(
            p.fn, p.base, p.scale, p.d_model, rows, p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, post,
            comb, x, mixes);
    else
        mhc_collapse_kernel<HC, false, false, true, float><<<blocks, kThreads, 0, stream>>>(
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

void mhc_pre(const MhcDeviceParams& p, const __nv_bfloat16* h, int64_t rows, float* post,
             float* comb, __nv_bfloat16* x, cudaStream_t stream) {
    if (rows == 0) return;
    CPFILL_CHECK(p.sinkhorn_iters >= 1, "mhc_pre: hc_sinkhorn_iters must be ≥ 1, found {}",
                 p.sinkhorn_iters);
    dispatch_hc(p.hc, [&](auto hc) {
        launch_collapse<decltype(hc)::value, false>(p.fn, p.base, p.scale, p.d_model, rows,
                                                    p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, post,
                                                    comb, x, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

namespace {

template <class H>
void post_impl(const float* post, const float* comb, const __nv_bfloat16* o, int hc,
               int64_t d_model, int64_t rows, H* h, cudaStream_t stream) {
    const int64_t total = rows * d_model;
    if (total == 0) return;
    const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
    dispatch_hc(hc, [&](auto c) {
        mhc_post_kernel<decltype(c)::value, H>
            <<<blocks, kThreads, 0, stream>>>(post, comb, o, d_model, rows, h);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

template <class H>
void head_impl(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
               float hc_eps, float norm_eps, const H* h, int64_t rows, __nv_bfloat16* z,
               cudaStream_t stream) {
    if (rows == 0) return;
    dispatch_hc(hc, [&](auto c) {
        launch_collapse<decltype(c)::value, true>(fn, base, scale, d_model, rows, 0, hc_eps,
                                                  norm_eps, h, nullptr, nullptr, z, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, float* h, cudaStream_t stream) {
    post_impl(post, comb, o, hc, d_model, rows, h, stream);
}

void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, __nv_bfloat16* h, cudaStream_t stream) {
    post_impl(post, comb, o, hc, d_model, rows, h, stream);
}

void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream) {
    head_impl(fn, base, scale, hc, d_model, hc_eps, norm_eps, h, rows, z, stream);
}

void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const __nv_bfloat16* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream) {
    head_impl(fn, base, scale, hc, d_model, hc_eps, norm_eps, h, rows, z, stream);
}

}  // namespace cpfill::ops::cuda
