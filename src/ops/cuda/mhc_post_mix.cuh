// Kernel 1 of mhc_post_pre (mhc_fused.cu): a site boundary's post update and the next site's
// mixing products. Included by mhc_fused.cu only; everything is internal to it.
//
// A block of 256 threads owns kTile = 32 tokens and one slice of d_model, walked in chunks of
// kChunk = 32 channels of every stream (kKc = hc · 32 positions). Per chunk:
//   staging   cp.async copies h [kTile, kKc] and the next site's fn [kMix, kKc] (fp32, as stored)
//             into a ring of kStages = 3 shared buffers, two chunks ahead of the update: ≈ 36 KB of
//             h per block in flight, none of it in registers (zeros past the rows / d_model).
//   update    thread (token t = tid / 8, q = tid % 8) reads channels 4q … 4q+3 of each stream of
//             token t from the buffer, forms h' = post · o + combᵀ · h (mhc_post_kernel's
//             operations in its order; o, 4 bf16, loaded one chunk ahead into registers), writes
//             h' to global memory and back into the buffer in place, and sums its squares.
//   product   mix[t, m] += Σ_p h'[t, p] · fn[m, p] on the tensor cores: mma.sync m16n8k8 with tf32
//             operands, each fp32 value split into a tf32 high part and a tf32 low part and three
//             products summed (lo·hi + hi·lo + hi·hi: ≈ 2⁻²¹ relative per product, the fp32
//             reference's accuracy where one tf32 product would give 2⁻¹¹). M = 32 tokens (2
//             tiles), N = kMix padded to 8 (3 tiles for hc 4), K = the chunk; warp w takes the
//             k-steps w, w + 8, … and keeps its own accumulators (summed over warps at the end).
// Shared rows have a stride of kLd = kKc + 4 floats (≡ 4 mod 32): a fragment's 8 rows × 4 columns
// fall on 32 distinct banks, and the update's float4 rows on distinct quads.
// The CUDA-core SGEMM this replaces needed 24 fp32 FMAs per element of h' beside the stream (≈ 37%
// of the fp32 peak at the stream's rate) and ran at ≈ 57% of the bytes' floor
// (docs/performance-notes.md, sessions 24, 29 and 30).
// At the end: split d_model (splits > 1): the block writes per token the slice's mixes and Σ h'²
// (part fp32 [splits, rows, kVals]). One slice (kSite): those are the token's totals, so warp 0
// runs the next site's math (one lane per token) → post_out, comb_out, and pre → part [rows, hc].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/mhc_device.cuh"
#include "ops/cuda/ptx.cuh"

namespace cpfill::ops::cuda {
namespace {

constexpr int kTile = 32;                          // tokens per block of kernel 1
constexpr int kChunk = 32;                         // channels of each stream per chunk
constexpr int kFusedThreads = kTile * kChunk / 4;  // one (token, 4 channels) per thread
constexpr int kStages = 3;                         // shared buffers of the staging ring
static_assert(kFusedThreads == kThreads, "kernel 1's warps split the chunk's k-steps 8 ways");

template <int HC>
struct PostMix {
    static constexpr int kMix = (2 + HC) * HC;
    static constexpr int kVals = kMix + 1;      // scratch values per token and slice
    static constexpr int kNt = (kMix + 7) / 8;  // n-tiles of the product
    static constexpr int kMixPad = 8 * kNt;     // rows of Bs; rows kMix … stay zero
    static constexpr int kKc = HC * kChunk;     // flattened positions per chunk
    static constexpr int kKSteps = kKc / 8;     // k-steps of 8 per chunk
    static constexpr int kKPerWarp = (kKSteps + kWarps - 1) / kWarps;
    static constexpr int kLd = kKc + 4;       // row stride of As and Bs in floats
    static constexpr int kA = kTile * kLd;    // floats of As (h' of the chunk)
    static constexpr int kB = kMixPad * kLd;  // floats of Bs (fn of the chunk)
    static constexpr int kStage = kA + kB;
    static constexpr int kRed = kWarps * kTile * kMixPad;  // the per-warp sums at the end
    static constexpr int kEnd = kRed + kTile * kVals;      // … and the tile's totals (kSite)
    static constexpr int kFloats = kStages * kStage > kEnd ? kStages* kStage : kEnd;
    static constexpr int kSmemBytes = kFloats * static_cast<int>(sizeof(float));
    static_assert(kLd % 32 == 4 && kLd % 4 == 0, "bank pattern, 16-byte rows");
};

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// h ← post · o + combᵀ · h for kTile tokens × one slice of d_model, and per token the slice's
// (2 + HC)·HC products with `next`'s fn and Σ h² → part fp32 [splits, rows, kVals].
// kSite (one slice, splits == 1): the block's sums are the tokens' totals; it runs the site math of
// `next` itself → post_out, comb_out, and pre → part fp32 [rows, HC] instead (post_out / comb_out
// may alias post / comb: the block read its own rows of those at its start).
// kVec: 16-byte copies of h / fn and 8-byte o (d_model % 4 == 0, aligned pointers), else 4-byte.
// Dynamic shared memory: PostMix<HC>::kSmemBytes.
template <int HC, bool kVec, bool kSite>
__global__ void __launch_bounds__(kFusedThreads, 2)
    mhc_post_mix_kernel(const float* post, const float* comb, const __nv_bfloat16* o,
                        const MhcDeviceParams next, int64_t rows, int64_t chunks_per_split,
                        float* h, float* part, float* post_out, float* comb_out) {
    using F = PostMix<HC>;
    const float* const fn = next.fn;
    const int64_t d_model = next.d_model;
    extern __shared__ __align__(16) float smem[];  // kStages × {As [kTile, kLd], Bs [kMixPad, kLd]}
    __shared__ float tok_ss[kTile];
    __shared__ float coef[kTile][HC + HC * HC];  // post_k, then comb[j, k], of each token
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t width = HC * d_model;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
    const int n_rows = static_cast<int>(rows - row0 < kTile ? rows - row0 : kTile);
    const int64_t n_chunks = (d_model + kChunk - 1) / kChunk;
    const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_split;
    const int64_t c_end =
        c_begin + chunks_per_split < n_chunks ? c_begin + chunks_per_split : n_chunks;
    const int64_t n = c_end > c_begin ? c_end - c_begin : 0;

    // Update role: token t, channels 4q … 4q + 3 of each chunk, every stream.
    const int t = tid >> 3, q = tid & 7;
    const bool tok = t < n_rows;
    const int64_t row = row0 + t;  // read only when tok
    // Zeros past the last row: the update gives zeros there.
    for (int i = tid; i < kTile * HC; i += kFusedThreads)
        coef[i / HC][i % HC] = i / HC < n_rows ? post[row0 * HC + i] : 0.0f;
    for (int i = tid; i < kTile * HC * HC; i += kFusedThreads)
        coef[i / (HC * HC)][HC + i % (HC * HC)] =
            i / (HC * HC) < n_rows ? comb[row0 * HC * HC + i] : 0.0f;
    if constexpr (F::kMixPad > F::kMix) {  // Bs rows past kMix, in every buffer
        constexpr int kPad = (F::kMixPad - F::kMix) * F::kLd;
        for (int i = tid; i < kStages * kPad; i += kFusedThreads)
            smem[(i / kPad) * F::kStage + F::kA + F::kMix * F::kLd + i % kPad] = 0.0f;
    }

    // Chunk c's h and fn into buffer s (cp.async; zeros past the rows and past d_model).
    auto stage = [&](int64_t c, int s) {
        float* const As = smem + s * F::kStage;
        float* const Bs = As + F::kA;
        const int64_t d0 = c * kChunk;
        if constexpr (kVec) {
            constexpr int kQ = kChunk / 4;
            for (int i = tid; i < kTile * HC * kQ; i += kFusedThreads) {
                const int tt = i / (HC * kQ), k = (i / kQ) % HC, qq = i % kQ;
                const int64_t d = d0 + 4 * qq;
                const bool ok = tt < n_rows && d < d_model;
                cp_async16(smem_u32(As + tt * F::kLd + k * kChunk + 4 * qq),
                           ok ? h + (row0 + tt) * width + k * d_model + d : h, ok);
            }
            for (int i = tid; i < F::kMix * HC * kQ; i += kFusedThreads) {
                const int m = i / (HC * kQ), k = (i / kQ) % HC, qq = i % kQ;
                const int64_t d = d0 + 4 * qq;
                const bool ok = d < d_model;
                cp_async16(smem_u32(Bs + m * F::kLd + k * kChunk + 4 * qq),
                           ok ? fn + m * width + k * d_model + d : fn, ok);
            }
        } else {
            for (int i = tid; i < kTile * F::kKc; i += kFusedThreads) {
                const int tt = i / F::kKc, k = (i / kChunk) % HC, e = i % kChunk;
                const int64_t d = d0 + e;
                const bool ok = tt < n_rows && d < d_model;
                cp_async4_zfill(smem_u32(As + tt * F::kLd + k * kChunk + e),
                                ok ? h + (row0 + tt) * width + k * d_model + d : h, ok);
            }
            for (int i = tid; i < F::kMix * F::kKc; i += kFusedThreads) {
                const int m = i / F::kKc, k = (i / kChunk) % HC, e = i % kChunk;
                const int64_t d = d0 + e;
                const bool ok = d < d_model;
                cp_async4_zfill(smem_u32(Bs + m * F::kLd + k * kChunk + e),
                                ok ? fn + m * width + k * d_model + d : fn, ok);
            }
        }
    };
    uint2 ov;  // o of the next chunk, 4 bf16 as stored
    auto load_o = [&](int64_t c) {
        const int64_t d = c * kChunk + 4 * q;
        const __nv_bfloat16* os = o + row * d_model + d;
        if constexpr (kVec) {
            ov = tok && d < d_model ? *reinterpret_cast<const uint2*>(os) : make_uint2(0u, 0u);
        } else {
            uint32_t b[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
                b[e] = tok && d + e < d_model ? __bfloat16_as_ushort(os[e]) : 0u;
            ov = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
        }
    };
    // The chunk's update in buffer s: h' to global memory (valid positions) and in place, squares
    // into ss. The same operations in the same order as mhc_post_kernel.
    float ss = 0.0f;
    auto update = [&](int64_t c, int s) {
        const int64_t d = c * kChunk + 4 * q;
        float* const at = smem + s * F::kStage + t * F::kLd + 4 * q;
        float4 hv[HC];
#pragma unroll
        for (int j = 0; j < HC; ++j) hv[j] = *reinterpret_cast<const float4*>(at + j * kChunk);
        const float4 of = make_float4(bf16_lo(ov.x), bf16_hi(ov.x), bf16_lo(ov.y), bf16_hi(ov.y));
        float* hd = h + row * width + d;
#pragma unroll
        for (int k = 0; k < HC; ++k) {
            const float p = coef[t][k];
            float4 v = make_float4(p * of.x, p * of.y, p * of.z, p * of.w);
#pragma unroll
            for (int j = 0; j < HC; ++j) {
                const float w = coef[t][HC + j * HC + k];
                v.x += w * hv[j].x;
                v.y += w * hv[j].y;
                v.z += w * hv[j].z;
                v.w += w * hv[j].w;
            }
            *reinterpret_cast<float4*>(at + k * kChunk) = v;
            ss += v.x * v.x;
            ss += v.y * v.y;
            ss += v.z * v.z;
            ss += v.w * v.w;
            if constexpr (kVec) {
                if (tok && d < d_model)  // __stwb: a plain store, kept one 16-byte access
                    __stwb(reinterpret_cast<float4*>(hd + k * d_model), v);
            } else {
                const float e4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (tok && d + e < d_model) hd[k * d_model + e] = e4[e];
            }
        }
    };

    // Product role: fragment rows g (+ 8), columns tig (+ 4) (PTX m16n8k8 layouts).
    const int g = lane >> 2, tig = lane & 3;
    float acc[2][F::kNt][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < F::kNt; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    auto product = [&](int s) {
        const float* const As = smem + s * F::kStage;
        const float* const Bs = As + F::kA;
#pragma unroll
        for (int kk = 0; kk < F::kKPerWarp; ++kk) {
            const int ks = warp + kk * kWarps;
            if (ks >= F::kKSteps) break;
            const int col = ks * 8 + tig;
            uint32_t ah[2][4], al[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const float* a = As + (mt * 16 + g) * F::kLd + col;
                split_tf32(a[0], ah[mt][0], al[mt][0]);
                split_tf32(a[8 * F::kLd], ah[mt][1], al[mt][1]);
                split_tf32(a[4], ah[mt][2], al[mt][2]);
                split_tf32(a[8 * F::kLd + 4], ah[mt][3], al[mt][3]);
            }
#pragma unroll
            for (int nt = 0; nt < F::kNt; ++nt) {
                const float* b = Bs + (nt * 8 + g) * F::kLd + col;
                uint32_t bh0, bl0, bh1, bl1;
                split_tf32(b[0], bh0, bl0);
                split_tf32(b[4], bh1, bl1);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {  // the small terms first
                    mma_tf32(acc[mt][nt], al[mt], bh0, bh1);
                    mma_tf32(acc[mt][nt], ah[mt], bl0, bl1);
                    mma_tf32(acc[mt][nt], ah[mt], bh0, bh1);
                }
            }
        }
    };

    // The ring: chunk i is in buffer i % kStages; one commit group per chunk (empty past the end).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n) stage(c_begin + s, s);
        cp_async_commit();
    }
    if (n > 0) load_o(c_begin);
    for (int64_t i = 0; i < n; ++i) {
        const int buf = static_cast<int>(i % kStages);
        cp_async_wait<kStages - 2>();  // chunk i has landed (this thread's copies)
        __syncthreads();  // … and everyone's; the product of chunk i − 1 is done, its buffer free
        if (i + kStages - 1 < n)
            stage(c_begin + i + kStages - 1, static_cast<int>((i + kStages - 1) % kStages));
        cp_async_commit();
        update(c_begin + i, buf);
        if (i + 1 < n) load_o(c_begin + i + 1);  // in flight during the product
        __syncthreads();                         // h' of the chunk is complete in the buffer
        product(buf);
    }
    cp_async_wait<0>();
    __syncthreads();

    float* const red = smem;  // fp32 [kWarps, kTile, kMixPad]: the ring is no longer read
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < F::kNt; ++nt) {
            float* r = red + (warp * kTile + mt * 16 + g) * F::kMixPad + nt * 8 + 2 * tig;
            r[0] = acc[mt][nt][0];
            r[1] = acc[mt][nt][1];
            r[8 * F::kMixPad] = acc[mt][nt][2];
            r[8 * F::kMixPad + 1] = acc[mt][nt][3];
        }
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

}  // namespace
}  // namespace cpfill::ops::cuda
