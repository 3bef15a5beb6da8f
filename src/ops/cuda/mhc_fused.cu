// mhc_post_pre (mhc.h): a site boundary — post, next pre, RMSNorm — in two kernels.
// Kernel 1, mhc_post_mix_kernel (mhc_post_mix.cuh): a block of 256 threads owns kTile = 32 tokens
//   and one slice of d_model (one slice unless the tiles are too few to fill the GPU, then up to
//   kMaxSplit); it streams h through shared memory, writes the updated h once and multiplies it
//   with the next site's fn on the tensor cores (split tf32, fp32 accuracy). Split d_model (splits
//   > 1): per token the slice's mixes and sum of squares → scratch [splits, rows, kVals]. One slice
//   (splits == 1, the case at long lengths) with vector access for kernel 2: those are the token's
//   totals, so warp 0 runs the site math of mhc_pre itself (one lane per token) → post_out,
//   comb_out, and pre → scratch [rows, hc].
// Kernel 2 then, by path:
//   one slice, vector access: mhc_collapse_norm_kernel, pure streaming. One token per block; reads
//   pre and h (16-byte loads, ≥ 8 in flight per thread, the bf16 collapse kept in registers), sums
//   the squares (shuffle + one barrier) and writes y once, scaled. d_model ≤ kStreamMaxD.
//   otherwise: mhc_pre_norm_kernel, kRows tokens per block; sums the slices, runs the site math
//   (one thread per token) → post_out, comb_out, the collapse (h read once more) and the RMSNorm:
//   the bf16 collapse is written to y, its squares summed, and y rewritten scaled (each thread
//   re-reads only what it wrote itself, an L2 hit).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/mhc.h"
#include "ops/cuda/mhc_device.cuh"
#include "ops/cuda/mhc_post_mix.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kMaxSplit = 8;        // most slices of d_model per tile
constexpr int kTargetBlocks = 264;  // two blocks of kernel 1 on each of an H200's 132 SMs

// Two floats rounded to bf16, as stored (the first in the low half).
__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Four bf16 of the collapse v (as stored) normed: bf16(w · (x · inv)), as rmsnorm_kernel (norm.cu)
// computes each; shared by both second kernels.
__device__ __forceinline__ uint2 norm_bf16x4(uint2 v, float4 w, float inv) {
    return make_uint2(bf16x2_bits(w.x * (bf16_lo(v.x) * inv), w.y * (bf16_hi(v.x) * inv)),
                      bf16x2_bits(w.z * (bf16_lo(v.y) * inv), w.w * (bf16_hi(v.y) * inv)));
}

// Kernel 2: per token, the slices' sums from part fp32 [splits, rows, kVals] → post, comb (site
// math of mhc_pre) and the collapse x = Σ_j pre_j · h[j] → y bf16; with kNorm, y ← rmsnorm(y) ·
// norm_w as rmsnorm_kernel (norm.cu) computes it. kVec: float4 h / norm_w, 8-byte y.
template <int HC, bool kVec, bool kNorm>
__global__ void __launch_bounds__(kThreads)
    mhc_pre_norm_kernel(const float* part, int64_t splits, const float* base, const float* scale,
                        int64_t d_model, int64_t rows, int sinkhorn_iters, float hc_eps,
                        float norm_eps, const float* h, const float* norm_w, float rms_eps,
                        float* post, float* comb, __nv_bfloat16* y) {
    constexpr int kVals = (2 + HC) * HC + 1;
    const int64_t width = HC * d_model;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int n_rows = static_cast<int>(rows - row0 < kRows ? rows - row0 : kRows);
    __shared__ float total[kRows * kVals];
    __shared__ float pre[kRows][HC];
    __shared__ float partial[kWarps][kRows];
    __shared__ float inv_rms[kRows];

    for (int i = threadIdx.x; i < n_rows * kVals; i += kThreads) {
        float s = 0.0f;
        for (int64_t sp = 0; sp < splits; ++sp) s += part[(sp * rows + row0) * kVals + i];
        total[i] = s;
    }
    __syncthreads();
    if (threadIdx.x < n_rows)
        site_weights<HC, false>(total + threadIdx.x * kVals, width, base, scale, sinkhorn_iters,
                                hc_eps, norm_eps, pre[threadIdx.x], post, comb, row0 + threadIdx.x);
    __syncthreads();

    float ss[kRows];  // Σ bf16(x)² of this thread's channels
#pragma unroll
    for (int r = 0; r < kRows; ++r) ss[r] = 0.0f;
    auto sq = [](float& acc, float v) { acc += v * v; };
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        if (r >= n_rows) break;
        const float* ht = h + (row0 + r) * width;
        __nv_bfloat16* yt = y + (row0 + r) * d_model;
        if constexpr (kVec) {
            const float4* ht4 = reinterpret_cast<const float4*>(ht);
            const int64_t d4 = d_model / 4;
            for (int64_t d = threadIdx.x; d < d4; d += kThreads) {
                const float4 s = collapse4<HC>(ht4, d4, d, pre[r]);
                const uint2 v = make_uint2(bf16x2_bits(s.x, s.y), bf16x2_bits(s.z, s.w));
                __stwb(reinterpret_cast<uint2*>(yt) + d, v);
                sq(ss[r], bf16_lo(v.x));
                sq(ss[r], bf16_hi(v.x));
                sq(ss[r], bf16_lo(v.y));
                sq(ss[r], bf16_hi(v.y));
            }
        } else {
            for (int64_t d = threadIdx.x; d < d_model; d += kThreads) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < HC; ++j) s += pre[r][j] * ht[j * d_model + d];
                const __nv_bfloat16 v = __float2bfloat16(s);
                yt[d] = v;
                sq(ss[r], __bfloat162float(v));
            }
        }
    }
    if constexpr (kNorm) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float v = warp_sum(ss[r]);
            if (lane == 0) partial[warp][r] = v;
        }
        __syncthreads();
        if (threadIdx.x < kRows) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) s += partial[w][threadIdx.x];
            inv_rms[threadIdx.x] = rsqrtf(s / static_cast<float>(d_model) + rms_eps);
        }
        __syncthreads();
        // y = w · (x · scale) as rmsnorm_kernel; each thread re-reads the y it wrote.
        for (int r = 0; r < n_rows; ++r) {
            const float inv = inv_rms[r];
            __nv_bfloat16* yt = y + (row0 + r) * d_model;
            if constexpr (kVec) {
                uint2* y4 = reinterpret_cast<uint2*>(yt);
                const float4* w4 = reinterpret_cast<const float4*>(norm_w);
                for (int64_t d = threadIdx.x; d < d_model / 4; d += kThreads) {
                    const uint2 v = y4[d];  // written by this thread above
                    const float4 w = __ldg(w4 + d);
                    __stwb(y4 + d, norm_bf16x4(v, w, inv));
                }
            } else {
                for (int64_t d = threadIdx.x; d < d_model; d += kThreads)
                    yt[d] = __float2bfloat16(norm_w[d] * (__bfloat162float(yt[d]) * inv));
            }
        }
    }
}

// Kernel 2 of the one-slice path, pure streaming: block t is token t, pre [HC] from kernel 1 (part
// fp32 [rows, HC]). Thread i owns the float4 groups i + g · blockDim.x (g < kStreamGroups) of
// d_model, taken kBatch groups at a time: the batch's HC · kBatch 16-byte loads of h (≥ 8;
// evict-first, h is not read again soon, norm_w stays cached) are issued together, then combined as
// mhc_pre_norm_kernel does (combine4) and kept in registers as the bf16 collapse; its squares are
// summed. A warp shuffle and one barrier give the token's Σ, and y is written once (8-byte stores):
// bf16(w · (x · inv)) with kNorm, else x. No store before the last load, so the compiler may also
// run batches ahead. Needs d_model % 4 == 0, d_model ≤ kStreamMaxD, 16-byte h / norm_w, 8-byte y.
constexpr int kStreamThreads = 256;  // most threads per block (fewer when d_model < 1024)
constexpr int kStreamGroups = 8;     // most float4 groups of each stream per thread
constexpr int64_t kStreamMaxD = 4 * kStreamGroups * kStreamThreads;

template <int HC, bool kNorm>
__global__ void __launch_bounds__(kStreamThreads, 4)
    mhc_collapse_norm_kernel(const float* pre_in, const float* h, int64_t d_model,
                             const float* norm_w, float rms_eps, __nv_bfloat16* y) {
    constexpr int kBatch = (8 + HC - 1) / HC;  // groups whose loads are in flight together
    const int64_t t = blockIdx.x;
    const int d4 = static_cast<int>(d_model / 4), tid = threadIdx.x, nt = blockDim.x;
    const float4* const ht4 = reinterpret_cast<const float4*>(h + t * HC * d_model);
    float pre[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) pre[j] = pre_in[t * HC + j];

    uint2 x[kStreamGroups];  // the bf16 collapse of this thread's groups, as stored
    float ss = 0.0f;         // Σ bf16(x)² over them
#pragma unroll
    for (int g0 = 0; g0 < kStreamGroups; g0 += kBatch) {
        float4 a[kBatch][HC];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int g = g0 + b, d = tid + g * nt;
            if (g < kStreamGroups && d < d4) {
#pragma unroll
                for (int j = 0; j < HC; ++j) a[b][j] = __ldcs(ht4 + j * d4 + d);
            }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int g = g0 + b, d = tid + g * nt;
            if (g < kStreamGroups && d < d4) {
                const float4 s = combine4<HC>(a[b], pre);
                x[g] = make_uint2(bf16x2_bits(s.x, s.y), bf16x2_bits(s.z, s.w));
                ss += bf16_lo(x[g].x) * bf16_lo(x[g].x);
                ss += bf16_hi(x[g].x) * bf16_hi(x[g].x);
                ss += bf16_lo(x[g].y) * bf16_lo(x[g].y);
                ss += bf16_hi(x[g].y) * bf16_hi(x[g].y);
            }
        }
    }
    [[maybe_unused]] float inv = 1.0f;
    if constexpr (kNorm) {
        __shared__ float partial[kStreamThreads / 32];
        ss = warp_sum(ss);
        if ((tid & 31) == 0) partial[tid >> 5] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int w = 0; w < nt / 32; ++w) tot += partial[w];
        inv = rsqrtf(tot / static_cast<float>(d_model) + rms_eps);
    }
    uint2* const yt = reinterpret_cast<uint2*>(y + t * d_model);
#pragma unroll
    for (int g = 0; g < kStreamGroups; ++g) {
        const int d = tid + g * nt;
        if (d < d4) {
            uint2 v = x[g];
            if constexpr (kNorm) {  // as rmsnorm_kernel (norm.cu)
                const float4 w = __ldg(reinterpret_cast<const float4*>(norm_w) + d);
                v = norm_bf16x4(v, w, inv);
            }
            __stwb(yt + d, v);
        }
    }
}

// How mhc_post_pre cuts the work: tiles of kTile tokens × slices of d_model. One slice per tile
// while the tiles fill the GPU (kTargetBlocks / 2 or more); else as many as keep the blocks within
// kTargetBlocks (at most kMaxSplit, at most one per chunk), each slice a whole number of chunks.
struct FusedSplit {
    int64_t tiles, splits, chunks_per_split;
};

FusedSplit fused_split(int64_t rows, int64_t d_model) {
    const int64_t tiles = (rows + kTile - 1) / kTile, chunks = (d_model + kChunk - 1) / kChunk;
    const int64_t want = tiles > 0 ? kTargetBlocks / tiles : 1;
    const int64_t s = std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxSplit, chunks));
    const int64_t per = (chunks + s - 1) / s;
    return {tiles, (chunks + per - 1) / per, per};
}

template <int HC>
void launch_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                     const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                     float* h, float* post_out, float* comb_out, __nv_bfloat16* y, float* scratch,
                     cudaStream_t stream) {
    using Yes = std::true_type;
    using No = std::false_type;
    const FusedSplit sp = fused_split(rows, p.d_model);
    const bool vec2 = p.d_model % 4 == 0 && aligned(h, 16) && aligned(y, 8) &&
                      (norm_w == nullptr || aligned(norm_w, 16));
    // One slice and vector access: kernel 1 runs the site math, kernel 2 only streams.
    const bool streaming = sp.splits == 1 && vec2 && p.d_model <= kStreamMaxD;

    const dim3 grid1(static_cast<unsigned>(sp.tiles), static_cast<unsigned>(sp.splits));
    const bool vec1 = p.d_model % 4 == 0 && aligned(h, 16) && aligned(p.fn, 16) && aligned(o, 8);
    auto post_mix = [&](auto vec, auto site) {
        const auto kernel = mhc_post_mix_kernel<HC, decltype(vec)::value, decltype(site)::value>;
        constexpr int smem = PostMix<HC>::kSmemBytes;
        CPFILL_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kernel<<<grid1, kFusedThreads, smem, stream>>>(
            post_in, comb_in, o, p, rows, sp.chunks_per_split, h, scratch, post_out, comb_out);
    };
    if (vec1 && streaming)
        post_mix(Yes{}, Yes{});
    else if (vec1)
        post_mix(Yes{}, No{});
    else if (streaming)
        post_mix(No{}, Yes{});
    else
        post_mix(No{}, No{});
    CPFILL_CUDA_CHECK(cudaGetLastError());

    if (streaming) {
        const int64_t d4 = p.d_model / 4;
        const int threads =
            d4 >= kStreamThreads ? kStreamThreads : static_cast<int>((d4 + 31) / 32 * 32);
        const unsigned blocks = static_cast<unsigned>(rows);
        if (norm_w)
            mhc_collapse_norm_kernel<HC, true>
                <<<blocks, threads, 0, stream>>>(scratch, h, p.d_model, norm_w, norm_eps, y);
        else
            mhc_collapse_norm_kernel<HC, false>
                <<<blocks, threads, 0, stream>>>(scratch, h, p.d_model, norm_w, norm_eps, y);
        return;
    }
    const unsigned blocks2 = static_cast<unsigned>((rows + kRows - 1) / kRows);
    auto collapse = [&](auto vec, auto norm) {
        mhc_pre_norm_kernel<HC, decltype(vec)::value, decltype(norm)::value>
            <<<blocks2, kThreads, 0, stream>>>(scratch, sp.splits, p.base, p.scale, p.d_model, rows,
                                               p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, norm_w,
                                               norm_eps, post_out, comb_out, y);
    };
    if (vec2 && norm_w)
        collapse(Yes{}, Yes{});
    else if (vec2)
        collapse(Yes{}, No{});
    else if (norm_w)
        collapse(No{}, Yes{});
    else
        collapse(No{}, No{});
}

}  // namespace

int64_t mhc_post_pre_scratch_bytes(int hc, int64_t d_model, int64_t rows) {
    CPFILL_CHECK(hc >= 1 && hc <= 4, "mhc_post_pre: hc_mult {} is not supported (1 to 4)", hc);
    CPFILL_CHECK(d_model >= 1 && rows >= 0, "mhc_post_pre: d_model {} and rows {}", d_model, rows);
    const int64_t n_vals = int64_t{2 + hc} * hc + 1;
    // A call of r ≤ rows tokens uses splits(r) · r rows of partial sums: r with one slice, else at
    // most kMaxSplit · r and at most kTargetBlocks · kTile (splits ≤ kTargetBlocks / tiles).
    const int64_t most = std::max<int64_t>(
        rows, std::min<int64_t>(kMaxSplit * rows, int64_t{kTargetBlocks} * kTile));
    (void)d_model;
    return most * n_vals * int64_t{sizeof(float)};
}

void mhc_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                  const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                  float* h, float* post_out, float* comb_out, __nv_bfloat16* y, float* scratch,
                  cudaStream_t stream) {
    if (rows == 0) return;
    CPFILL_CHECK(next.sinkhorn_iters >= 1, "mhc_post_pre: hc_sinkhorn_iters must be ≥ 1, found {}",
                 next.sinkhorn_iters);
    CPFILL_CHECK(next.d_model >= 1, "mhc_post_pre: d_model must be ≥ 1, found {}", next.d_model);
    dispatch_hc(next.hc, [&](auto hc) {
        launch_post_pre<decltype(hc)::value>(post_in, comb_in, o, next, norm_w, norm_eps, rows, h,
                                             post_out, comb_out, y, scratch, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
