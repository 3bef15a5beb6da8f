// attention_tc: the attention of ops/cuda/attention.h (AttnArgs) on tensor cores, mma.sync
// m16n8k16 bf16 → fp32. One block of 8 warps per (query, group of kM ∈ {16, 32, 64} heads); the
// query's key list (window keys, then entries) streams through shared memory in tiles of kTile = 64
// keys, double-buffered with cp.async. Per tile:
//   loads    warps 4–7 start the copy of the next tile (and stage the CSA entry_idx values of the
//            tile after it, so row addresses never wait on global loads);
//   logits   meanwhile warps 0 … kSWarps−1 compute S[kM, 64] = Q·Kᵀ (K-dim 512), each a block of
//            (16 or 32) heads × 32 keys, Q and K read from shared memory by ldmatrix;
//   softmax  online, fp32, log2 domain: the two warps of a row block meet their maxima in shared
//            memory, then write their probabilities as bf16 P[kM, 64] and their row sums (of the
//            rounded values, so numerator and denominator agree);
//   P·V      all 8 warps: warp w owns O[all kM heads, channels 64w … 64w+63] in fp32 registers
//            (2·kM per thread), rescales it by e^(m_old − m_new) (skipped when every factor is 1)
//            and adds P·V (V = the same key tile, read transposed by ldmatrix.trans).
// Rows are padded by 16 bytes (Q and K rows 1040 B, P rows 144 B) so the 8 row addresses of every
// ldmatrix phase fall in different banks. Padded heads (beyond n_heads) are zero queries whose
// rows are never written; keys beyond the list are zero-filled rows with logit −∞.
// Optional prologue and epilogue (AttnArgs q_norm, rope_dim): once Q is in shared memory (its own
// cp.async group, waited for while key tile 0 is still in flight), one warp per real head row
// RMS-normalises and rotates it in fp32 and rounds it once to bf16; the output's RoPE slice is
// de-rotated in fp32 registers, before the single rounding into the bf16 staging rows.
// Why it stays beside attention_wg (the model's kernel on Hopper, ≈ 2× this one's rate): GPUs
// that are not Hopper, RoPE slices over 64 channels, and CPFILL_ATTENTION=tc for comparisons.
#include <cstdint>

#include "ops/cuda/attention.h"
#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/ptx.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using namespace attention_device;

constexpr int kTile = 64;  // keys per shared-memory tile (N of the logits, K-dim of P·V)
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kLd = kHeadDim + 8;                // padded Q / K row (bf16)
constexpr int kPLd = kTile + 8;                  // padded P row (bf16)
constexpr int kChunks = kHeadDim / 8;            // 16-byte chunks per row
constexpr int kDimsPerWarp = kHeadDim / kWarps;  // P·V channels per warp (64)
constexpr int kLoadWarp0 = 4;                    // warps 4–7 issue the tile copies
constexpr int kSKeys = kTile / 2;                // logits: keys per warp (two warps per row block)

template <int kM>
struct TcSmem {
    alignas(16) __nv_bfloat16 q[kM][kLd];        // the group's queries; output staging at the end
    alignas(16) __nv_bfloat16 k[2][kTile][kLd];  // two key tiles (K = V)
    alignas(16) __nv_bfloat16 p[kM][kPLd];       // this tile's probabilities
    float red_max[2][kM];                        // per-warp row maxima of this tile (log2 domain)
    float red_sum[2][kM];                        // per-warp row sums of this tile's probabilities
    float m[2][kM];                              // running row max, ping-pong by tile parity
    float l[kM];                                 // running row sum
    float alpha[kM];                             // this tile's rescale e^(m_old − m_new)
    int32_t sel[2][kTile];  // entry_idx values of a coming tile, slot = tile parity
};

// Per-head RMSNorm (no weight, when norm) and RoPE of the first n_rows query rows in shared
// memory (attention_device::norm_rope_row), one warp per row.
template <int kM>
__device__ void norm_rope_q(TcSmem<kM>& s, int n_rows, bool norm, float eps, int rope_dim,
                            const float* inv_freq, float pos) {
    const int lane = threadIdx.x & 31;
    const LaneRope rope = lane_rope(lane, rope_dim, inv_freq, pos);
    for (int r = threadIdx.x >> 5; r < n_rows; r += kWarps)
        norm_rope_row(reinterpret_cast<uint4*>(&s.q[r][lane * 8]),
                      reinterpret_cast<uint4*>(&s.q[r][kHeadDim / 2 + lane * 8]), norm, eps, rope);
}

// Starts the copy of keys k0 … k0 + kTile − 1 of the list into dst; rows past the list are zeros.
// Called by the 4 loader warps (lw = 0 … 3): warp lw copies rows lw, lw + 4, …, a row in two
// 512-byte steps. CSA entry rows come from sel_tile (the tile's entry_idx values staged in shared
// memory by prefetch_sel) or, when it is null, from kl.sel.
__device__ __forceinline__ void load_tile(__nv_bfloat16 (*dst)[kLd], const KeyList& kl, int64_t k0,
                                          const int32_t* sel_tile, int lw) {
    const int c = (threadIdx.x & 31) * 8;
#pragma unroll 4
    for (int r = lw; r < kTile; r += 4) {
        const int64_t key = k0 + r;
        const bool valid = key < kl.n_keys;
        const __nv_bfloat16* row = valid ? key_row(kl, key, sel_tile, r) : kl.window;
        cp_async16(smem_u32(&dst[r][c]), row + c, valid);
        cp_async16(smem_u32(&dst[r][c + kHeadDim / 2]), row + c + kHeadDim / 2, valid);
    }
}

// Starts the copy of the entry_idx values of keys k0 … k0 + kTile − 1 (entry keys only) into dst,
// so that load_tile need not wait on global loads for its row addresses. i: the caller's index
// among ≥ kTile threads.
__device__ __forceinline__ void prefetch_sel(int32_t* dst, const KeyList& kl, int64_t k0, int i) {
    const int64_t key = k0 + i;
    if (kl.sel && i < kTile && key >= kl.n_window && key < kl.n_keys)
        cp_async4(smem_u32(dst + i), kl.sel + (key - kl.n_window));
}

// S = Q·Kᵀ for this warp's kMfS·16 heads (from row m0) × 32 keys (from key n0), K-dim 512.
template <int kM, int kMfS>
__device__ __forceinline__ void logits_tile(const TcSmem<kM>& s, int buf, int m0, int n0,
                                            float (&acc)[kMfS][4][4]) {
    const int lane = threadIdx.x & 31;
    // A (Q rows): lanes 0–15 rows m0 … m0+15 at k, lanes 16–31 the same rows at k + 8.
    const uint32_t a_addr = smem_u32(&s.q[m0 + (lane & 15)][(lane >> 4) * 8]);
    // B (K rows = columns of Kᵀ): matrices (keys +0–7, k), (+0–7, k+8), (+8–15, k), (+8–15, k+8).
    const uint32_t b_addr =
        smem_u32(&s.k[buf][n0 + (lane & 7) + (lane >> 4) * 8][((lane >> 3) & 1) * 8]);
#pragma unroll
    for (int mf = 0; mf < kMfS; ++mf)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[mf][j][0] = acc[mf][j][1] = acc[mf][j][2] = acc[mf][j][3] = 0;
#pragma unroll 4
    for (int kk = 0; kk < kHeadDim; kk += 16) {
        uint32_t a[kMfS][4];
#pragma unroll
        for (int mf = 0; mf < kMfS; ++mf) ldsm_x4(a[mf], a_addr + (mf * 16 * kLd + kk) * 2);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            uint32_t b[4];
            ldsm_x4(b, b_addr + (j * 16 * kLd + kk) * 2);
#pragma unroll
            for (int mf = 0; mf < kMfS; ++mf) {
                mma_bf16(acc[mf][2 * j], a[mf], b[0], b[1]);
                mma_bf16(acc[mf][2 * j + 1], a[mf], b[2], b[3]);
            }
        }
    }
}

// O[kM, 64 channels from d0] = O·alpha + P·V for this warp.
template <int kM>
__device__ __forceinline__ void pv_tile(const TcSmem<kM>& s, int buf, int d0,
                                        float (&o)[kM / 16][8][4]) {
    constexpr int kMf = kM / 16;
    const int lane = threadIdx.x & 31, g = lane >> 2;
    float lo[kMf], hi[kMf];
    bool rescale = false;
#pragma unroll
    for (int mf = 0; mf < kMf; ++mf) {
        lo[mf] = s.alpha[mf * 16 + g];
        hi[mf] = s.alpha[mf * 16 + g + 8];
        rescale |= lo[mf] != 1.0f || hi[mf] != 1.0f;
    }
    if (__any_sync(0xffffffffu, rescale)) {  // no row max moved: nothing to rescale
#pragma unroll
        for (int mf = 0; mf < kMf; ++mf) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                o[mf][nt][0] *= lo[mf];
                o[mf][nt][1] *= lo[mf];
                o[mf][nt][2] *= hi[mf];
                o[mf][nt][3] *= hi[mf];
            }
        }
    }
    const uint32_t a_addr = smem_u32(&s.p[lane & 15][(lane >> 4) * 8]);
    // V rows read transposed: matrices (keys +0–7, ch +0–7), (+8–15, +0–7), (+0–7, +8–15), (+8–15,
    // +8–15) give b0, b1 of channel tile 2j and b0, b1 of channel tile 2j + 1.
    const uint32_t v_addr =
        smem_u32(&s.k[buf][(lane & 7) + ((lane >> 3) & 1) * 8][d0 + (lane >> 4) * 8]);
#pragma unroll
    for (int kk = 0; kk < kTile; kk += 16) {
        uint32_t b[8][2];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t r[4];
            ldsm_x4_trans(r, v_addr + (kk * kLd + j * 16) * 2);
            b[2 * j][0] = r[0];
            b[2 * j][1] = r[1];
            b[2 * j + 1][0] = r[2];
            b[2 * j + 1][1] = r[3];
        }
#pragma unroll
        for (int mf = 0; mf < kMf; ++mf) {
            uint32_t a[4];
            ldsm_x4(a, a_addr + (mf * 16 * kPLd + kk) * 2);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) mma_bf16(o[mf][nt], a, b[nt][0], b[nt][1]);
        }
    }
}

// Logits and softmax of one tile for a logits warp (row block wm, key half wn): S → −∞-masked
// log2-domain logits → row maxima shared with the other key half → P (bf16), row sums, and (key
// half 0) the new running max and the rescale factors. Two barriers, which every thread reaches.
template <int kM, int kMfS>
__device__ __forceinline__ void softmax_tile(TcSmem<kM>& s, bool logits_warp, int buf, int par,
                                             int wm, int wn, int n_valid, float scale_log2) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    const int m0 = wm * 16 * kMfS, n0 = wn * kSKeys;
    float acc[kMfS][4][4];
    if (logits_warp) {
        logits_tile<kM, kMfS>(s, buf, m0, n0, acc);
#pragma unroll
        for (int mf = 0; mf < kMfS; ++mf) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = n0 + j * 8 + 2 * c4;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool ok = col + (e & 1) < n_valid;
                    acc[mf][j][e] = ok ? acc[mf][j][e] * scale_log2 : -INFINITY;
                }
                mx0 = fmaxf(mx0, fmaxf(acc[mf][j][0], acc[mf][j][1]));
                mx1 = fmaxf(mx1, fmaxf(acc[mf][j][2], acc[mf][j][3]));
            }
            mx0 = quad_max(mx0);
            mx1 = quad_max(mx1);
            if (c4 == 0) {
                s.red_max[wn][m0 + mf * 16 + g] = mx0;
                s.red_max[wn][m0 + mf * 16 + g + 8] = mx1;
            }
        }
    }
    __syncthreads();  // row maxima of both key halves
    if (logits_warp) {
#pragma unroll
        for (int mf = 0; mf < kMfS; ++mf) {
            const int r0 = m0 + mf * 16 + g, r1 = r0 + 8;
            // Column 0 of every tile is a real key: m_new is finite and 2^(−∞ − m_new) = 0.
            const float old0 = s.m[par][r0], old1 = s.m[par][r1];
            const float new0 = fmaxf(old0, fmaxf(s.red_max[0][r0], s.red_max[1][r0]));
            const float new1 = fmaxf(old1, fmaxf(s.red_max[0][r1], s.red_max[1][r1]));
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = n0 + j * 8 + 2 * c4;
                const __nv_bfloat162 lo = __floats2bfloat162_rn(fast_exp2(acc[mf][j][0] - new0),
                                                                fast_exp2(acc[mf][j][1] - new0));
                const __nv_bfloat162 hi = __floats2bfloat162_rn(fast_exp2(acc[mf][j][2] - new1),
                                                                fast_exp2(acc[mf][j][3] - new1));
                *reinterpret_cast<__nv_bfloat162*>(&s.p[r0][col]) = lo;
                *reinterpret_cast<__nv_bfloat162*>(&s.p[r1][col]) = hi;
                const float2 lo_f = __bfloat1622float2(lo), hi_f = __bfloat1622float2(hi);
                sum0 += lo_f.x + lo_f.y;
                sum1 += hi_f.x + hi_f.y;
            }
            sum0 = quad_sum(sum0);
            sum1 = quad_sum(sum1);
            if (c4 == 0) {
                s.red_sum[wn][r0] = sum0;
                s.red_sum[wn][r1] = sum1;
                if (wn == 0) {
                    s.m[par ^ 1][r0] = new0;
                    s.m[par ^ 1][r1] = new1;
                    s.alpha[r0] = exp2f(old0 - new0);
                    s.alpha[r1] = exp2f(old1 - new1);
                }
            }
        }
    }
    __syncthreads();  // P, row sums, alpha
}

template <int kM>
__global__ void __launch_bounds__(kThreads, 1)
    attention_tc_kernel(const __nv_bfloat16* q, const int64_t* pos, int n_heads,
                        const __nv_bfloat16* window, int64_t window0, int window_size,
                        const __nv_bfloat16* entries, int64_t n_entries, int ratio,
                        const int32_t* entry_idx, int64_t idx_stride, const float* sinks,
                        float scale, __nv_bfloat16* out, bool q_norm, float q_norm_eps,
                        int rope_dim, const float* inv_freq) {
    constexpr int kMf = kM / 16;             // 16-head fragments (P·V, every warp)
    constexpr int kMfS = kM >= 32 ? 2 : 1;   // 16-head fragments of a logits warp
    constexpr int kSWarps = 2 * kMf / kMfS;  // logits warps: row blocks × 2 key halves
    static_assert(kSWarps <= kLoadWarp0, "logits and loader warps overlap");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    TcSmem<kM>& s = *reinterpret_cast<TcSmem<kM>*>(smem_raw);
    const int n_groups = (n_heads + kM - 1) / kM;
    const int64_t t = blockIdx.x / n_groups;
    const int h0 = static_cast<int>(blockIdx.x % n_groups) * kM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const bool loader = warp >= kLoadWarp0;
    const int64_t p = pos[t];

    // Q's copies first: their latency overlaps the key list's count (a global read of the row of
    // entry_idx and a block barrier per 256 values).
    for (int i = tid; i < kM * kChunks; i += kThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        const bool valid = h0 + r < n_heads;
        const __nv_bfloat16* src = valid ? q + (t * n_heads + h0 + r) * kHeadDim + c : q;
        cp_async16(smem_u32(&s.q[r][c]), src, valid);
    }
    cp_async_commit();
    const KeyList kl = key_list(p, t, window, window0, window_size, entries, n_entries, ratio,
                                entry_idx, idx_stride);
    const int n_tiles = static_cast<int>((kl.n_keys + kTile - 1) / kTile);

    if (tid < kM) {
        s.m[0][tid] = -INFINITY;
        s.l[tid] = 0.0f;
    }
    if (loader) {
        load_tile(s.k[0], kl, 0, nullptr, warp - kLoadWarp0);
        prefetch_sel(s.sel[1], kl, kTile, tid - kLoadWarp0 * 32);
    }
    cp_async_commit();
    if (q_norm || rope_dim > 0) {
        cp_async_wait<1>();  // this thread's Q copies (tile 0 may still be in flight)
        __syncthreads();     // every thread's; the loop's first barrier orders the result
        const int n_rows = n_heads - h0 < kM ? n_heads - h0 : kM;  // padded rows stay zero
        norm_rope_q<kM>(s, n_rows, q_norm, q_norm_eps, rope_dim, inv_freq, static_cast<float>(p));
    }

    const float scale_log2 = scale * kLog2e;
    float o[kMf][8][4] = {};
    for (int it = 0; it < n_tiles; ++it) {
        const int buf = it & 1, par = it & 1;
        cp_async_wait<0>();
        __syncthreads();  // tile `it` visible; every warp is done with tile it − 1 (buffer buf ^ 1)
        if (loader && it + 1 < n_tiles) {  // tile it + 1 and the entry rows of tile it + 2
            load_tile(s.k[buf ^ 1], kl, static_cast<int64_t>(it + 1) * kTile, s.sel[buf ^ 1],
                      warp - kLoadWarp0);
            prefetch_sel(s.sel[buf], kl, static_cast<int64_t>(it + 2) * kTile,
                         tid - kLoadWarp0 * 32);
            cp_async_commit();
        }
        const int64_t left = kl.n_keys - static_cast<int64_t>(it) * kTile;
        const int n_valid = left < kTile ? static_cast<int>(left) : kTile;
        softmax_tile<kM, kMfS>(s, warp < kSWarps, buf, par, warp / 2, warp % 2, n_valid,
                               scale_log2);
        if (tid < kM) s.l[tid] = s.l[tid] * s.alpha[tid] + s.red_sum[0][tid] + s.red_sum[1][tid];
        pv_tile<kM>(s, buf, warp * kDimsPerWarp, o);
    }
    __syncthreads();  // final l and m; every warp is done with Q (its rows become output staging)

    // Sink in the denominator only: out = O·e^(m−M) / (l·e^(m−M) + e^(sink−M)), M = max(m, sink).
    // Then the inverse RoPE: this thread's channel pairs (d0 + 8nt + 2c4, +1) are RoPE pairs.
    const int par = n_tiles & 1, d0 = warp * kDimsPerWarp;
    float cs[8], sn[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
        rope_cos_sin(d0 + nt * 8 + 2 * c4, rope_dim, inv_freq, static_cast<float>(p), true, cs[nt],
                     sn[nt]);
#pragma unroll
    for (int mf = 0; mf < kMf; ++mf) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = mf * 16 + g + half * 8;
            float inv = 0.0f;
            if (h0 + r < n_heads) {
                const float m = s.m[par][r], sink = sinks[h0 + r] * kLog2e;
                const float mm = fmaxf(m, sink), f = exp2f(m - mm);
                inv = f / (s.l[r] * f + exp2f(sink - mm));
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                float a = o[mf][nt][2 * half] * inv, b = o[mf][nt][2 * half + 1] * inv;
                rope_device::rotate(a, b, cs[nt], sn[nt]);
                *reinterpret_cast<__nv_bfloat162*>(&s.q[r][d0 + nt * 8 + 2 * c4]) =
                    __floats2bfloat162_rn(a, b);
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < kM * kChunks; i += kThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        if (h0 + r < n_heads)
            *reinterpret_cast<uint4*>(&out[(t * n_heads + h0 + r) * kHeadDim + c]) =
                *reinterpret_cast<const uint4*>(&s.q[r][c]);
    }
}

template <int kM>
void launch(const AttnArgs& a, cudaStream_t stream) {
    const int smem = static_cast<int>(sizeof(TcSmem<kM>));
    CPFILL_CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel<kM>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t blocks = a.n_q * ((a.n_heads + kM - 1) / kM);
    CPFILL_CHECK(blocks <= 0x7fffffff, "attention_tc: {} queries × head groups in one call",
                 blocks);
    attention_tc_kernel<kM><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
        a.q, a.pos, a.n_heads, a.window, a.window0, a.window_size, a.entries, a.n_entries, a.ratio,
        a.entry_idx, a.idx_stride, a.sinks, a.scale, a.out, a.q_norm, a.q_norm_eps, a.rope_dim,
        a.inv_freq);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_tc(const AttnArgs& a, cudaStream_t stream) {
    if (a.n_q == 0) return;
    check_attention_args(a, "attention_tc");
    if (a.n_heads <= 16) {
        launch<16>(a, stream);
    } else if (a.n_heads <= 32) {
        launch<32>(a, stream);
    } else {
        launch<64>(a, stream);  // 64 heads per block; more heads take more blocks
    }
}

}  // namespace cpfill::ops::cuda
