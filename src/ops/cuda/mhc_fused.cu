// mhc_post_pre (mhc.h): a site boundary — post, next pre, RMSNorm — in two kernels.
// Kernel 1, mhc_post_mix_kernel: a block of 256 threads owns kTile = 32 tokens and one slice of
//   d_model (chunks of kChunk = 32 channels; one slice unless the tiles are too few to fill the
//   GPU, then up to kMaxSplit). Per chunk, thread (token t = tid / 8, q = tid % 8) updates channels
//   4q … 4q+3 of every stream of token t in registers (h read once, written once, float4) and
//   stores them to As [kTile][hc·kChunk + 4] in shared memory; the chunk's fn [(2+hc)·hc,
//   hc·kChunk] is in Bs [kMixPad][hc·kChunk + 4] (cp.async, double-buffered, one chunk ahead), the
//   next chunk's h and o are loaded into registers while the block multiplies. The product is a
//   CUDA-core fp32 SGEMM: the 8 warps split a chunk's hc·kChunk positions (4·hc each); lane
//   (tg = lane % 8, mg = lane / 8) accumulates tokens tg + 8i (i < 4) × mixes mg + 4j (j < kTn = 6
//   for hc = 4): per 4 positions 4 + kTn float4 shared loads feed 16·kTn FMA (96 per 10 loads).
//   Row stride hc·kChunk + 4 floats (a multiple of 4, /4 odd): the 8 (A) or 4 (B) rows a warp reads
//   at one column fall on distinct bank quads. Per-warp partial products meet in shared memory at
//   the end. Split d_model (splits > 1): the block writes per token the slice's mixes and sum of
//   squares (scratch [splits, rows, kVals]). One slice (splits == 1, the case at long lengths)
//   with vector access for kernel 2: those are the token's totals, so warp 0 runs the site math of
//   mhc_pre itself (one lane per token) → post_out, comb_out, and pre → scratch [rows, hc].
// Every kernel is a template over the residual's element type (fp32 or bf16, mhc.h): the loads
// and stores of h are 4 · sizeof(H) bytes, a bf16 h is rounded as kernel 1 stores it, and what
// kernel 1 multiplies and squares are the rounded values; the arithmetic is fp32 either way.
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
#include "ops/cuda/ptx.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kTile = 32;                          // tokens per block of kernel 1
constexpr int kChunk = 32;                         // channels of each stream per chunk
constexpr int kFusedThreads = kTile * kChunk / 4;  // one (token, 4 channels) per thread
constexpr int kMaxSplit = 8;                       // most slices of d_model per tile
constexpr int kTargetBlocks = 264;                 // two blocks on each of an H200's 132 SMs
static_assert(kFusedThreads == kThreads, "kernel 1's warps split the chunk 8 ways");

template <int HC>
struct Fused {
    static constexpr int kMix = (2 + HC) * HC;
    static constexpr int kVals = kMix + 1;      // scratch values per token and slice
    static constexpr int kTn = (kMix + 3) / 4;  // mixes per thread in the product
    static constexpr int kMixPad = 4 * kTn;     // rows of Bs; rows kMix … stay zero
    static constexpr int kKc = HC * kChunk;     // flattened positions per chunk
    static constexpr int kLd = kKc + 4;         // row stride of As and Bs in floats (kLd / 4 odd)
    static constexpr int kA = kTile * kLd;      // floats of As
    static constexpr int kB = kMixPad * kLd;    // floats of one Bs buffer
    static constexpr int kRed = kWarps * kTile * kMixPad;  // the per-warp sums at the end
    static constexpr int kEnd = kRed + kTile * kVals;      // … and the tile's totals (kSite)
    static constexpr int kSmem = kA + 2 * kB > kEnd ? kA + 2 * kB : kEnd;
    static_assert((kLd / 4) % 2 == 1 && kKc % (4 * kWarps) == 0, "bank quads, warp split");
};

// 4-byte global → shared copy; valid == false writes a zero and reads nothing.
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

// Kernel 1: h ← post · o + combᵀ · h for kTile tokens × one slice of d_model, and per token the
// slice's (2 + HC)·HC products with `next`'s fn and Σ h² → part fp32 [splits, rows, kVals].
// kSite (one slice, splits == 1): the block's sums are the tokens' totals; it runs the site math of
// `next` itself → post_out, comb_out, and pre → part fp32 [rows, HC] instead (post_out / comb_out
// may alias post / comb: the block read its own rows of those at its start).
// kVec: 4-value h, float4 fn, 8-byte o (d_model % 4 == 0, aligned pointers), else scalar.
// H: the residual's element type; a bf16 h is rounded as it is stored, and the products and
// squares are taken from the rounded values.
// kFirst: no update (post, comb and o are not read, h is not written): h's streams all hold stream
// 0's values (the first site of a chunk: embed_streams), so only stream 0 is read and it stands
// for every stream in the products and the squares.
// in_stride: elements from one stream of h to the next as the update reads them: d_model, or 0
// where every stream holds stream 0's values but only stream 0 was written (mhc_post_pre_first;
// the same arithmetic, so the same bits as on h with every stream written). Ignored with kFirst.
template <int HC, bool kVec, bool kSite, class H, bool kFirst>
__global__ void __launch_bounds__(kFusedThreads, 2)
    mhc_post_mix_kernel(const float* post, const float* comb, const __nv_bfloat16* o,
                        const MhcDeviceParams next, int64_t rows, int64_t chunks_per_split,
                        int64_t in_stride, H* h, float* part, float* post_out, float* comb_out) {
    using F = Fused<HC>;
    const float* const fn = next.fn;
    const int64_t d_model = next.d_model;
    __shared__ __align__(16) float smem[F::kSmem];
    __shared__ float tok_ss[kTile];
    __shared__ float coef[kTile][HC + HC * HC];  // post_k, then comb[j, k], of each token
    float* const As = smem;                      // fp32 [kTile, kLd]: the updated h of the chunk
    float* const Bs = smem + F::kA;              // fp32 [2, kMixPad, kLd]: fn of the chunk
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t width = HC * d_model;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
    const int n_rows = static_cast<int>(rows - row0 < kTile ? rows - row0 : kTile);
    const int64_t n_chunks = (d_model + kChunk - 1) / kChunk;
    const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_split;
    const int64_t c_end =
        c_begin + chunks_per_split < n_chunks ? c_begin + chunks_per_split : n_chunks;

    // Update role: token t, channels 4q … 4q + 3 of each chunk, every stream.
    const int t = tid >> 3, q = tid & 7;
    const bool tok = t < n_rows;
    const int64_t row = row0 + t;  // read only when tok
    // Zeros past the last row: the update gives zeros there.
    if constexpr (!kFirst) {
        for (int i = tid; i < kTile * HC; i += kFusedThreads)
            coef[i / HC][i % HC] = i / HC < n_rows ? post[row0 * HC + i] : 0.0f;
        for (int i = tid; i < kTile * HC * HC; i += kFusedThreads)
            coef[i / (HC * HC)][HC + i % (HC * HC)] =
                i / (HC * HC) < n_rows ? comb[row0 * HC * HC + i] : 0.0f;
    }
    if constexpr (F::kMixPad > F::kMix) {
        constexpr int kPad = (F::kMixPad - F::kMix) * F::kLd;
        for (int i = tid; i < 2 * kPad; i += kFusedThreads)
            Bs[(i / kPad) * F::kB + F::kMix * F::kLd + i % kPad] = 0.0f;
    }
    __syncthreads();  // coef before the first update, the zero rows before the first product

    float4 hv[HC];  // h of the next chunk (token t, 4 channels, each stream)
    uint2 ov;       // o of the next chunk, 4 bf16 as stored
    constexpr int kLoadStreams = kFirst ? 1 : HC;  // the streams read; kFirst: stream 0 for all
    auto load = [&](int64_t c) {
        const int64_t d = c * kChunk + 4 * q;
        const H* hs = h + row * width + d;
        const __nv_bfloat16* os = kFirst ? nullptr : o + row * d_model + d;
        if constexpr (kVec) {
#pragma unroll
            for (int j = 0; j < HC; ++j) hv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ov = make_uint2(0u, 0u);
            if (tok && d < d_model) {
#pragma unroll
                for (int j = 0; j < kLoadStreams; ++j) hv[j] = h_load4(hs + j * in_stride);
                if constexpr (!kFirst) ov = *reinterpret_cast<const uint2*>(os);
            }
#pragma unroll
            for (int j = kLoadStreams; j < HC; ++j) hv[j] = hv[0];
        } else {
            float v[HC][4];
            uint32_t b[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = tok && d + e < d_model;
#pragma unroll
                for (int j = 0; j < HC; ++j)
                    v[j][e] = ok ? h_get(hs + (j < kLoadStreams ? j : 0) * in_stride + e) : 0.0f;
                b[e] = ok && !kFirst ? __bfloat16_as_ushort(os[e]) : 0u;
            }
#pragma unroll
            for (int j = 0; j < HC; ++j) hv[j] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
            ov = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
        }
    };
    // The chunk's update from hv / ov: to h (valid positions), to As (all), squares into ss. The
    // same operations in the same order as mhc_post_kernel; rounded to H before any use.
    // kFirst: h as loaded (stream 0's values in every stream) to As, squares into ss.
    float ss = 0.0f;
    auto update = [&](int64_t c) {
        const int64_t d = c * kChunk + 4 * q;
        const float4 of = make_float4(bf16_lo(ov.x), bf16_hi(ov.x), bf16_lo(ov.y), bf16_hi(ov.y));
        H* hd = h + row * width + d;
#pragma unroll
        for (int k = 0; k < HC; ++k) {
            float4 s = hv[k];
            if constexpr (!kFirst) {
                const float p = coef[t][k];
                s = make_float4(p * of.x, p * of.y, p * of.z, p * of.w);
#pragma unroll
                for (int j = 0; j < HC; ++j) {
                    const float w = coef[t][HC + j * HC + k];
                    s.x += w * hv[j].x;
                    s.y += w * hv[j].y;
                    s.z += w * hv[j].z;
                    s.w += w * hv[j].w;
                }
                s = h_round4<H>(s);
            }
            *reinterpret_cast<float4*>(As + t * F::kLd + k * kChunk + 4 * q) = s;
            ss += s.x * s.x;
            ss += s.y * s.y;
            ss += s.z * s.z;
            ss += s.w * s.w;
            if constexpr (kFirst) continue;  // h is not written
            if constexpr (kVec) {
                if (tok && d < d_model) h_store4(hd + k * d_model, s);
            } else {
                const float e4[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (tok && d + e < d_model) h_put(hd + k * d_model + e, e4[e]);
            }
        }
    };
    // fn of chunk c into Bs buffer `buf` (zeros past d_model).
    auto stage = [&](int64_t c, int buf) {
        constexpr int kQ = kChunk / 4;
        for (int i = tid; i < F::kMix * HC * kQ; i += kFusedThreads) {
            const int m = i / (HC * kQ), k = (i / kQ) % HC, qq = i % kQ;
            const int64_t d = c * kChunk + 4 * qq, off = m * width + k * d_model + d;
            const uint32_t dst = smem_u32(Bs + buf * F::kB + m * F::kLd + k * kChunk + 4 * qq);
            if constexpr (kVec) {
                cp_async16(dst, fn + (d < d_model ? off : 0), d < d_model);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    cp_async4_zfill(dst + 4 * e, fn + (d + e < d_model ? off + e : 0),
                                    d + e < d_model);
            }
        }
    };

    // Product role: positions [warp · 4·HC, (warp + 1) · 4·HC) of each chunk; tokens tg + 8i,
    // mixes mg + 4j.
    const int tg = lane & 7, mg = lane >> 3;
    float acc[4][F::kTn];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < F::kTn; ++j) acc[i][j] = 0.0f;

    if (c_begin < c_end) {
        stage(c_begin, 0);
        load(c_begin);
    }
    cp_async_commit();
    for (int64_t c = c_begin; c < c_end; ++c) {
        const int buf = static_cast<int>(c - c_begin) & 1;
        update(c);  // As is free: the previous product ended with a barrier
        if (c + 1 < c_end) {
            load(c + 1);            // in flight during the product
            stage(c + 1, buf ^ 1);  // that buffer was last read by the previous product
        }
        cp_async_commit();
        cp_async_wait<1>();  // this chunk's fn has landed (this thread's copies)
        __syncthreads();     // … and everyone's, and As is complete
        const float* a0 = As + tg * F::kLd + warp * 4 * HC;
        const float* b0 = Bs + buf * F::kB + mg * F::kLd + warp * 4 * HC;
#pragma unroll
        for (int s = 0; s < HC; ++s) {
            float4 a[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                a[i] = *reinterpret_cast<const float4*>(a0 + i * 8 * F::kLd + 4 * s);
#pragma unroll
            for (int j = 0; j < F::kTn; ++j) {
                const float4 b = *reinterpret_cast<const float4*>(b0 + j * 4 * F::kLd + 4 * s);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    acc[i][j] += a[i].x * b.x;
                    acc[i][j] += a[i].y * b.y;
                    acc[i][j] += a[i].z * b.z;
                    acc[i][j] += a[i].w * b.w;
                }
            }
        }
        __syncthreads();  // As and this Bs buffer are rewritten next
    }
    cp_async_wait<0>();
    __syncthreads();

    float* const red = smem;  // fp32 [kWarps, kTile, kMixPad]: As / Bs are no longer read
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < F::kTn; ++j)
            red[(warp * kTile + tg + 8 * i) * F::kMixPad + mg + 4 * j] = acc[i][j];
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // the 8 lanes of token t
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    ss += __shfl_xor_sync(0xffffffffu, ss, 4);
    if (q == 0) tok_ss[t] = ss;
    __syncthreads();
    // kSite: the totals fp32 [kTile, kVals] in shared memory past red, for the site math.
    float* const out =
        kSite ? smem + F::kRed : part + (static_cast<int64_t>(blockIdx.y) * rows + row0) * F::kVals;
    for (int i = tid; i < n_rows * F::kVals; i += kFusedThreads) {
        const int r = i / F::kVals, m = i % F::kVals;
        float v = 0.0f;
        if (m < F::kMix) {
#pragma unroll
            for (int w = 0; w < kWarps; ++w) v += red[(w * kTile + r) * F::kMixPad + m];
        } else {
            v = tok_ss[r];
        }
        out[i] = v;
    }
    if constexpr (kSite) {
        __syncthreads();
        if (tid < n_rows) {  // warp 0, one token per lane, as kernel 2 of the split path
            float pre[HC];
            site_weights<HC, false>(out + tid * F::kVals, width, next.base, next.scale,
                                    next.sinkhorn_iters, next.hc_eps, next.norm_eps, pre, post_out,
                                    comb_out, row0 + tid);
#pragma unroll
            for (int j = 0; j < HC; ++j) part[(row0 + tid) * HC + j] = pre[j];
        }
    }
}

// Four bf16 of the collapse v (as stored) normed: bf16(w · (x · inv)), as rmsnorm_kernel (norm.cu)
// computes each; shared by both second kernels.
__device__ __forceinline__ uint2 norm_bf16x4(uint2 v, float4 w, float inv) {
    return make_uint2(bf16x2_bits(w.x * (bf16_lo(v.x) * inv), w.y * (bf16_hi(v.x) * inv)),
                      bf16x2_bits(w.z * (bf16_lo(v.y) * inv), w.w * (bf16_hi(v.y) * inv)));
}

// Kernel 2: per token, the slices' sums from part fp32 [splits, rows, kVals] → post, comb (site
// math of mhc_pre) and the collapse x = Σ_j pre_j · h[j] → y bf16; with kNorm, y ← rmsnorm(y) ·
// norm_w as rmsnorm_kernel (norm.cu) computes it. kVec: 4-value h, float4 norm_w, 8-byte y.
// stream_stride: elements from one stream of h to the next (d_model; 0 where every stream holds
// stream 0's values, the first site: stream 0 alone is read).
template <int HC, bool kVec, bool kNorm, class H>
__global__ void __launch_bounds__(kThreads)
    mhc_pre_norm_kernel(const float* part, int64_t splits, const float* base, const float* scale,
                        int64_t d_model, int64_t stream_stride, int64_t rows, int sinkhorn_iters,
                        float hc_eps, float norm_eps, const H* h, const float* norm_w,
                        float rms_eps, float* post, float* comb, __nv_bfloat16* y) {
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
        const H* ht = h + (row0 + r) * width;
        __nv_bfloat16* yt = y + (row0 + r) * d_model;
        if constexpr (kVec) {
            const int64_t d4 = d_model / 4;
            for (int64_t d = threadIdx.x; d < d4; d += kThreads) {
                const float4 s = collapse4<HC>(ht, stream_stride, d, pre[r]);
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
                for (int j = 0; j < HC; ++j) s += pre[r][j] * h_get(ht + j * stream_stride + d);
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
// fp32 [rows, HC]). Thread i owns the 4-channel groups i + g · blockDim.x (g < kStreamGroups) of
// d_model, taken kBatch groups at a time: the batch's HC · kBatch loads of h (≥ 8 of 16 bytes for
// fp32, ≥ 16 of 8 bytes for bf16: the same bytes in flight; evict-first, h is not read again soon,
// norm_w stays cached) are issued together, then combined as mhc_pre_norm_kernel does (combine4)
// and kept in registers as the bf16 collapse; its squares are summed. A warp shuffle and one
// barrier give the token's Σ, and y is written once (8-byte stores): bf16(w · (x · inv)) with
// kNorm, else x. No store before the last load, so the compiler may also run batches ahead. Needs
// d_model % 4 == 0, d_model ≤ kStreamMaxD, 4 · sizeof(H)-byte h, 16-byte norm_w, 8-byte y.
// kFirst: every stream of h holds stream 0's values (the first site): stream 0 alone is read, and
// stands for each stream in the collapse.
constexpr int kStreamThreads = 256;  // most threads per block (fewer when d_model < 1024)
constexpr int kStreamGroups = 8;     // most float4 groups of each stream per thread
constexpr int64_t kStreamMaxD = 4 * kStreamGroups * kStreamThreads;

// A group of 4 values of h as loaded by the streaming kernel (evict-first), and as fp32.
__device__ __forceinline__ float4 h_ldcs4(const float* p) {
    return __ldcs(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ uint2 h_ldcs4(const __nv_bfloat16* p) {
    return __ldcs(reinterpret_cast<const uint2*>(p));
}
__device__ __forceinline__ float4 unpack4(float4 v) { return v; }
__device__ __forceinline__ float4 unpack4(uint2 v) { return bf16x4_float4(v); }

template <int HC, bool kNorm, class H, bool kFirst>
__global__ void __launch_bounds__(kStreamThreads, 4)
    mhc_collapse_norm_kernel(const float* pre_in, const H* h, int64_t d_model, const float* norm_w,
                             float rms_eps, __nv_bfloat16* y) {
    constexpr int kLoads = kFirst ? 1 : HC;  // streams read per group
    // Groups whose loads are in flight together: 8 loads of 16 bytes, or 16 of 8.
    constexpr int kBatch = (32 / static_cast<int>(sizeof(H)) + kLoads - 1) / kLoads;
    using Raw = decltype(h_ldcs4(static_cast<const H*>(nullptr)));
    const int64_t t = blockIdx.x;
    const int d4 = static_cast<int>(d_model / 4), tid = threadIdx.x, nt = blockDim.x;
    const H* const ht = h + t * HC * d_model;
    float pre[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) pre[j] = pre_in[t * HC + j];

    uint2 x[kStreamGroups];  // the bf16 collapse of this thread's groups, as stored
    float ss = 0.0f;         // Σ bf16(x)² over them
#pragma unroll
    for (int g0 = 0; g0 < kStreamGroups; g0 += kBatch) {
        Raw a[kBatch][kLoads];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int g = g0 + b, d = tid + g * nt;
            if (g < kStreamGroups && d < d4) {
#pragma unroll
                for (int j = 0; j < kLoads; ++j) a[b][j] = h_ldcs4(ht + j * d_model + 4 * d);
            }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int g = g0 + b, d = tid + g * nt;
            if (g < kStreamGroups && d < d4) {
                float4 f[HC];
#pragma unroll
                for (int j = 0; j < HC; ++j) f[j] = unpack4(a[b][j < kLoads ? j : 0]);
                const float4 s = combine4<HC>(f, pre);
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

// kFirst: no update (post_in, comb_in, o unused; h only read), every stream of h holding stream
// 0's values (mhc_pre_first). in_stride: as mhc_post_mix_kernel's.
template <int HC, bool kFirst, class H>
void launch_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                     const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                     int64_t in_stride, H* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                     float* scratch, cudaStream_t stream) {
    using Yes = std::true_type;
    using No = std::false_type;
    const FusedSplit sp = fused_split(rows, p.d_model);
    const bool vec2 = p.d_model % 4 == 0 && aligned(h, 4 * sizeof(H)) && aligned(y, 8) &&
                      (norm_w == nullptr || aligned(norm_w, 16));
    // One slice and vector access: kernel 1 runs the site math, kernel 2 only streams.
    const bool streaming = sp.splits == 1 && vec2 && p.d_model <= kStreamMaxD;

    const dim3 grid1(static_cast<unsigned>(sp.tiles), static_cast<unsigned>(sp.splits));
    const bool vec1 = p.d_model % 4 == 0 && aligned(h, 4 * sizeof(H)) && aligned(p.fn, 16) &&
                      (kFirst || aligned(o, 8));
    auto post_mix = [&](auto vec, auto site) {
        mhc_post_mix_kernel<HC, decltype(vec)::value, decltype(site)::value, H, kFirst>
            <<<grid1, kFusedThreads, 0, stream>>>(post_in, comb_in, o, p, rows, sp.chunks_per_split,
                                                  in_stride, h, scratch, post_out, comb_out);
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
            mhc_collapse_norm_kernel<HC, true, H, kFirst>
                <<<blocks, threads, 0, stream>>>(scratch, h, p.d_model, norm_w, norm_eps, y);
        else
            mhc_collapse_norm_kernel<HC, false, H, kFirst>
                <<<blocks, threads, 0, stream>>>(scratch, h, p.d_model, norm_w, norm_eps, y);
        return;
    }
    const unsigned blocks2 = static_cast<unsigned>((rows + kRows - 1) / kRows);
    auto collapse = [&](auto vec, auto norm) {
        mhc_pre_norm_kernel<HC, decltype(vec)::value, decltype(norm)::value, H>
            <<<blocks2, kThreads, 0, stream>>>(
                scratch, sp.splits, p.base, p.scale, p.d_model, kFirst ? 0 : p.d_model, rows,
                p.sinkhorn_iters, p.hc_eps, p.norm_eps, h, norm_w, norm_eps, post_out, comb_out, y);
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

namespace {

// from_stream0: h's streams are read as stream 0 (mhc_post_pre_first).
template <bool kFirst, class H>
void post_pre_impl(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                   const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                   bool from_stream0, H* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                   float* scratch, cudaStream_t stream) {
    if (rows == 0) return;
    const char* const op =
        kFirst ? "mhc_pre_first" : (from_stream0 ? "mhc_post_pre_first" : "mhc_post_pre");
    CPFILL_CHECK(next.sinkhorn_iters >= 1, "{}: hc_sinkhorn_iters must be ≥ 1, found {}", op,
                 next.sinkhorn_iters);
    CPFILL_CHECK(next.d_model >= 1, "{}: d_model must be ≥ 1, found {}", op, next.d_model);
    dispatch_hc(next.hc, [&](auto hc) {
        launch_post_pre<decltype(hc)::value, kFirst>(post_in, comb_in, o, next, norm_w, norm_eps,
                                                     rows, from_stream0 ? 0 : next.d_model, h,
                                                     post_out, comb_out, y, scratch, stream);
    });
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void mhc_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                  const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                  float* h, float* post_out, float* comb_out, __nv_bfloat16* y, float* scratch,
                  cudaStream_t stream) {
    post_pre_impl<false>(post_in, comb_in, o, next, norm_w, norm_eps, rows, false, h, post_out,
                         comb_out, y, scratch, stream);
}

void mhc_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                  const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                  __nv_bfloat16* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                  float* scratch, cudaStream_t stream) {
    post_pre_impl<false>(post_in, comb_in, o, next, norm_w, norm_eps, rows, false, h, post_out,
                         comb_out, y, scratch, stream);
}

void mhc_post_pre_first(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                        const MhcDeviceParams& next, const float* norm_w, float norm_eps,
                        int64_t rows, float* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                        float* scratch, cudaStream_t stream) {
    post_pre_impl<false>(post_in, comb_in, o, next, norm_w, norm_eps, rows, true, h, post_out,
                         comb_out, y, scratch, stream);
}

void mhc_post_pre_first(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                        const MhcDeviceParams& next, const float* norm_w, float norm_eps,
                        int64_t rows, __nv_bfloat16* h, float* post_out, float* comb_out,
                        __nv_bfloat16* y, float* scratch, cudaStream_t stream) {
    post_pre_impl<false>(post_in, comb_in, o, next, norm_w, norm_eps, rows, true, h, post_out,
                         comb_out, y, scratch, stream);
}

// The kernel reads h only (kFirst): the const is cast away for the shared launch code.
void mhc_pre_first(const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                   const float* h, float* post, float* comb, __nv_bfloat16* y, float* scratch,
                   cudaStream_t stream) {
    post_pre_impl<true>(nullptr, nullptr, nullptr, p, norm_w, norm_eps, rows, true,
                        const_cast<float*>(h), post, comb, y, scratch, stream);
}

void mhc_pre_first(const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                   const __nv_bfloat16* h, float* post, float* comb, __nv_bfloat16* y,
                   float* scratch, cudaStream_t stream) {
    post_pre_impl<true>(nullptr, nullptr, nullptr, p, norm_w, norm_eps, rows, true,
                        const_cast<__nv_bfloat16*>(h), post, comb, y, scratch, stream);
}

}  // namespace cpfill::ops::cuda
