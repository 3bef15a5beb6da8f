// attention_wg: the attention of ops/cuda/attention.h (AttnArgs) on Hopper's warpgroup MMAs
// (wgmma, bf16 → fp32, sm_90a), warp-specialised. One block of three warpgroups per (query, group
// of 64 heads; fewer heads are padded with zero queries whose rows are never written):
//   WG2 (copies)   Q, then the query's key list (window keys, then entries) in pairs of 64-key
//                  tiles: the even tile of a pair into buffer 0, the odd one into buffer 1, each
//                  as two halves (channels 0–255, 256–511) with their own mbarriers (full: the
//                  cp.async copies of the 128 threads landed; empty: every MMA reading it done),
//                  so a half is refilled as soon as its last reader is done;
//   WG0, WG1       WG0 takes the even tiles, WG1 the odd ones. Per pair each computes its tile's
//                  logits S = Q·Kᵀ [64 heads × 64 keys] (m64n64k16 over the 512 channels), and owns
//                  half of the output O: WG0 channels 0–255, WG1 256–511, in fp32 registers (128 a
//                  thread). The running row max passes WG0 → WG1 → WG0 through shared memory each
//                  pair (WG0's tile max, then WG1's max over both), so both tiles' probabilities
//                  end on one max. Each warpgroup adds its own P (bf16, from registers) times its
//                  half of its own tile's V, and the other's P (from shared memory, written
//                  there after the exchange) times its half of the other tile's V (K = V, read
//                  MN-major). While one warpgroup is in its softmax the other's MMAs run.
// Numerics as attention_tc: logits and softmax in fp32 (log2 domain), P rounded once to bf16, the
// row sums of the rounded values, the sink in the denominator only; keys past the list are zero
// rows with logit −∞. Shared tiles are K-major rows of 128 bytes in the 128-byte swizzle (8 blocks
// of 64 channels, each 64 rows × 128 bytes). The optional prologue (q_norm, rope_dim) runs on the
// 8 compute warps once Q has landed; the epilogue applies the inverse RoPE in fp32 and stages the
// bf16 output in the Q buffer for coalesced stores. The schedule follows the one FlashMLA's sparse
// prefill kernel describes (docs/performance-notes.md, session 32).
#include <cstdint>

#include "ops/cuda/attention.h"
#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_bf16.cuh"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/sm90.h"

namespace cpfill::ops::cuda {

namespace {

using namespace attention_device;

constexpr int kM = 64;                // heads per block (wgmma's M)
constexpr int kTile = 64;             // keys per tile
constexpr int kThreads = 384;         // WG0, WG1 compute; WG2 copies
constexpr int kComputeThreads = 256;  // WG0 and WG1
// Registers per thread after the split: 2 · 128 · 232 + 128 · 40 ≤ 65,536.
constexpr int kComputeRegs = 232, kCopyRegs = 40;
constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks per row
constexpr uint32_t kBlockBytes = 64 * 128;        // one 64-channel block of 64 rows
constexpr uint32_t kHalfBytes = 4 * kBlockBytes;  // 64 rows × 256 channels
constexpr uint32_t kRowsBytes = 8 * kBlockBytes;  // 64 rows × 512 channels (Q, a key tile)

// Named barriers (0 is __syncthreads), each of the two compute warpgroups.
constexpr int kBarQ = 1;     // the prologue's rows written
constexpr int kBarMax0 = 2;  // WG0's new row max in s.m
constexpr int kBarMax1 = 3;  // WG1's new row max (over both tiles) in s.m
constexpr int kBarP0 = 4;    // WG0's P in s.p[0]
constexpr int kBarP1 = 5;    // WG1's P in s.p[1]
constexpr int kBarSum = 6;   // both row sums in s.sum
constexpr int kBarRope = 7;  // the RoPE slice staged in fp32
constexpr int kBarOut = 8;   // the output staged

struct WgSmem {
    alignas(1024) unsigned char q[kRowsBytes];      // Q; the output's staging at the end
    alignas(1024) unsigned char k[2][kRowsBytes];   // a pair's even (0) and odd (1) key tile
    alignas(1024) unsigned char p[2][kBlockBytes];  // each tile's P [64 heads × 64 keys]
    float m[kM];                                    // the row max handed between the warpgroups
    float sum[2][kM];                               // each warpgroup's row sums at the end
    uint64_t q_full;                                // Q landed
    uint64_t full[2][2];                            // [buffer][half] landed
    uint64_t empty[2][2];                           // [buffer][half] read by its last MMA
};

// Byte offset of 16-byte chunk c (0 … 63) of row r in a [64 rows × 512 channels] swizzled tile.
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return (c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Arrives on bar once every cp.async this thread has started so far has landed (the barrier's
// count includes this arrival).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
                 : "memory");
}

// Arrives on named barrier `id` of `count` threads without waiting (the other side syncs).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <int N>
__device__ __forceinline__ void reg_fence_all(float (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(v[i]);
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// The copy warpgroup: Q, then every pair's two tiles, half by half, in the order the compute
// warpgroups read them (even left, odd right, even right, odd left). Thread i copies 16-byte chunk
// i % 8 of each 64-channel block for rows i / 8 + 16j (j = 0 … 3) of a tile.
__device__ void copy_warpgroup(WgSmem& s, const KeyList& kl, const __nv_bfloat16* q_rows,
                               int n_q_rows, int n_pairs) {
    const int i = threadIdx.x - kComputeThreads;
    for (int x = i; x < kM * kChunks; x += 128) {
        const int r = x / kChunks, c = x % kChunks;
        const bool valid = r < n_q_rows;
        cp_async16(smem_u32(s.q) + swz(r, c), valid ? q_rows + r * kHeadDim + c * 8 : q_rows,
                   valid);
    }
    cp_async_mbar_arrive(&s.q_full);

    const int chunk = i & 7, row0 = i >> 3;
    // Destination of (row j, block b) of a buffer: the swizzle of row0 + 16j is row0's.
    const uint32_t dst0 = static_cast<uint32_t>(row0 * 128 + ((chunk ^ (row0 & 7)) << 4));
    const int n_keys = static_cast<int>(kl.n_keys);
    uint32_t parity = 1;  // a fresh barrier's previous phase counts as complete
    for (int pair = 0; pair < n_pairs; ++pair) {
        const __nv_bfloat16* src[2][4];
        bool ok[2][4];
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int key = (2 * pair + b) * kTile + row0 + 16 * j;
                ok[b][j] = key < n_keys;
                src[b][j] = (ok[b][j] ? key_row(kl, key, nullptr, 0) : kl.window) + chunk * 8;
            }
        auto copy_half = [&](int b, int half) __attribute__((always_inline)) {
            mbar_wait(&s.empty[b][half], parity);
            const uint32_t base = smem_u32(s.k[b]) + half * kHalfBytes + dst0;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int blk = 0; blk < 4; ++blk)
                    cp_async16(base + blk * kBlockBytes + j * 16 * 128,
                               src[b][j] + (half * 4 + blk) * 64, ok[b][j]);
            cp_async_mbar_arrive(&s.full[b][half]);
        };
        copy_half(0, 0);
        copy_half(1, 1);
        copy_half(0, 1);
        copy_half(1, 0);
        parity ^= 1;
    }
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_wg_kernel(const __nv_bfloat16* q, const int64_t* pos, int n_heads,
                        const __nv_bfloat16* window, int64_t window0, int window_size,
                        const __nv_bfloat16* entries, int64_t n_entries, int ratio,
                        const int32_t* entry_idx, int64_t idx_stride, const float* sinks,
                        float scale, __nv_bfloat16* out, bool q_norm, float q_norm_eps,
                        int rope_dim, const float* inv_freq) {
    extern __shared__ unsigned char smem_raw[];
    WgSmem& s = *reinterpret_cast<WgSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                           ~uintptr_t{1023});
    const int n_groups = (n_heads + kM - 1) / kM;
    const int64_t t = blockIdx.x / n_groups;
    const int h0 = static_cast<int>(blockIdx.x % n_groups) * kM;
    const int n_q_rows = n_heads - h0 < kM ? n_heads - h0 : kM;  // padded rows stay zero
    const int tid = threadIdx.x, wg = tid >> 7;
    const int64_t p = pos[t];

    if (tid == 0) {
        mbar_init(&s.q_full, 128);
        for (int b = 0; b < 2; ++b)
            for (int h = 0; h < 2; ++h) {
                mbar_init(&s.full[b][h], 128);
                mbar_init(&s.empty[b][h], 128);
            }
        mbar_init_fence();
    }
    __syncthreads();  // the barriers' init before any arrival
    const KeyList kl = key_list(p, t, window, window0, window_size, entries, n_entries, ratio,
                                entry_idx, idx_stride);
    const int n_tiles = static_cast<int>((kl.n_keys + kTile - 1) / kTile);
    const int n_pairs = (n_tiles + 1) / 2;  // an odd count's last odd tile is all past the list

    if (wg == 2) {
        setmaxnreg_dec<kCopyRegs>();
        copy_warpgroup(s, kl, q + (t * n_heads + h0) * kHeadDim, n_q_rows, n_pairs);
        return;
    }
    setmaxnreg_inc<kComputeRegs>();

    const int wt = tid & 127, lane = tid & 31, c4 = lane & 3;
    const int row0 = (wt >> 5) * 16 + (lane >> 2), row1 = row0 + 8;  // this thread's rows
    mbar_wait(&s.q_full, 0);
    if (q_norm || rope_dim > 0) {
        const LaneRope rope = lane_rope(lane, rope_dim, inv_freq, static_cast<float>(p));
        for (int r = tid >> 5; r < n_q_rows; r += kComputeThreads / 32)
            norm_rope_row(reinterpret_cast<uint4*>(s.q + swz(r, lane)),
                          reinterpret_cast<uint4*>(s.q + swz(r, lane + 32)), q_norm, q_norm_eps,
                          rope);
        fence_proxy_async_shared();  // the rows → wgmma's reads
        named_barrier_sync(kBarQ, kComputeThreads);
    }

    const float scale_log2 = scale * kLog2e;
    // Descriptors are built once: moving along a tile adds (bytes >> 4) to the start address field,
    // which never carries out of it (shared addresses are below 2^18).
    const uint64_t q_desc = wgmma_desc_sw128_lbo(smem_u32(s.q), 16);
    const uint64_t k_desc = wgmma_desc_sw128_lbo(smem_u32(s.k[wg]), 16);  // own tile, logits
    // P·V: this warpgroup's 256 channels of its own tile and of the other's.
    const uint64_t v_own = wgmma_desc_sw128_lbo(smem_u32(s.k[wg]) + wg * kHalfBytes, kBlockBytes);
    const uint64_t v_other =
        wgmma_desc_sw128_lbo(smem_u32(s.k[wg ^ 1]) + wg * kHalfBytes, kBlockBytes);
    const uint64_t p_other = wgmma_desc_sw128_lbo(smem_u32(s.p[wg ^ 1]), 16);
    unsigned char* const p_own = s.p[wg];

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float acc[32];
    uint32_t pa[4][4];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t parity = 0;

    // S (+)= Q·Kᵀ over channel half `half` of this warpgroup's tile; overwrite: the first half.
    auto logits_half = [&](int half, bool overwrite) __attribute__((always_inline)) {
        mbar_wait(&s.full[wg][half], parity);
        fence_proxy_async_shared();
        wgmma_fence();
#pragma unroll
        for (int kk = 16 * half; kk < 16 * half + 16; ++kk) {
            const uint32_t off = ((kk >> 2) * kBlockBytes + (kk & 3) * 32) >> 4;
            wgmma_m64n64k16_bf16(acc, q_desc + off, k_desc + off,
                                 overwrite && kk == 16 * half ? 0 : 1);
        }
        wgmma_commit();
    };
    // The logits in the log2 domain, −∞ past the list; returns the rows' tile maxima.
    auto mask_scale = [&](int tile, float& mx0, float& mx1) __attribute__((always_inline)) {
        const int n_valid = static_cast<int>(kl.n_keys) - tile * kTile;
        mx0 = -INFINITY;
        mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool in = j * 8 + 2 * c4 + (e & 1) < n_valid;
                acc[4 * j + e] = in ? acc[4 * j + e] * scale_log2 : -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(acc[4 * j], acc[4 * j + 1]));
            mx1 = fmaxf(mx1, fmaxf(acc[4 * j + 2], acc[4 * j + 3]));
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
    };
    auto scale_o = [&](float f0, float f1) __attribute__((always_inline)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            o[4 * j] *= f0;
            o[4 * j + 1] *= f0;
            o[4 * j + 2] *= f1;
            o[4 * j + 3] *= f1;
        }
    };
    // P = 2^(S − m) in place (fp32), the rounded values' sums into l (after l · alpha), O · alpha.
    auto softmax = [&](float new0, float new1) __attribute__((always_inline)) {
        const float alpha0 = exp2f(m0 - new0), alpha1 = exp2f(m1 - new1);
        m0 = new0;
        m1 = new1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            acc[4 * j] = fast_exp2(acc[4 * j] - new0);
            acc[4 * j + 1] = fast_exp2(acc[4 * j + 1] - new0);
            acc[4 * j + 2] = fast_exp2(acc[4 * j + 2] - new1);
            acc[4 * j + 3] = fast_exp2(acc[4 * j + 3] - new1);
            const float2 lo = unpack_bf16x2(bf16x2(acc[4 * j], acc[4 * j + 1]));
            const float2 hi = unpack_bf16x2(bf16x2(acc[4 * j + 2], acc[4 * j + 3]));
            sum0 += lo.x + lo.y;
            sum1 += hi.x + hi.y;
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
        scale_o(alpha0, alpha1);  // unconditionally: a branch here costs registers (copies of O)
    };
    // O += P (registers, bf16: pa, the A fragments of the 4 k-steps) · this warpgroup's half of its
    // own tile's V.
    auto pv_own = [&]() __attribute__((always_inline)) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            pa[kk][0] = bf16x2(acc[8 * kk], acc[8 * kk + 1]);
            pa[kk][1] = bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]);
            pa[kk][2] = bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]);
            pa[kk][3] = bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_bf16_rs(o, pa[kk], v_own + kk * 128, 1);
        wgmma_commit();
    };
    // P · f (bf16, from pa: f = 1 keeps it exact) into this warpgroup's P tile for the other one's
    // P·V. Column block j of the tile is k-step j / 2's registers 0, 1 (j even) or 2, 3.
    auto store_p = [&](float f0, float f1) __attribute__((always_inline)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 lo = unpack_bf16x2(pa[j >> 1][2 * (j & 1)]);
            const float2 hi = unpack_bf16x2(pa[j >> 1][2 * (j & 1) + 1]);
            *reinterpret_cast<uint32_t*>(p_own + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * c4) =
                bf16x2(lo.x * f0, lo.y * f0);
            *reinterpret_cast<uint32_t*>(p_own + row1 * 128 + ((j ^ (row1 & 7)) << 4) + 4 * c4) =
                bf16x2(hi.x * f1, hi.y * f1);
        }
        fence_proxy_async_shared();  // P → the other warpgroup's wgmma reads
    };
    // O += P_other (shared memory) · this warpgroup's half of the other tile's V.
    auto pv_other = [&]() __attribute__((always_inline)) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_m64n256k16_bf16_bmn(o, p_other + kk * 2, v_other + kk * 128, 1);
        wgmma_commit();
    };

    if (wg == 0) {
        for (int pair = 0; pair < n_pairs; ++pair) {
            logits_half(0, true);
            logits_half(1, false);
            wgmma_wait<0>();
            reg_fence_all(acc);
            float mx0, mx1;
            mask_scale(2 * pair, mx0, mx1);
            // Tile 2·pair has a real key in column 0: the new max is finite.
            softmax(fmaxf(m0, mx0), fmaxf(m1, mx1));
            __syncwarp();  // the quad's reads of s.m (last pair) come before this write
            if (c4 == 0) {
                s.m[row0] = m0;
                s.m[row1] = m1;
            }
            named_barrier_arrive(kBarMax0, kComputeThreads);
            pv_own();
            wgmma_wait<0>();
            reg_fence_all(o);
            mbar_arrive(&s.empty[0][0]);  // the even tile's left half: logits and P·V done

            named_barrier_sync(kBarMax1, kComputeThreads);
            const float n0 = s.m[row0], n1 = s.m[row1];  // the max over both tiles
            const float f0 = exp2f(m0 - n0), f1 = exp2f(m1 - n1);
            m0 = n0;
            m1 = n1;
            store_p(f0, f1);
            named_barrier_arrive(kBarP0, kComputeThreads);
            l0 *= f0;
            l1 *= f1;
            scale_o(f0, f1);
            named_barrier_sync(kBarP1, kComputeThreads);
            pv_other();
            wgmma_wait<0>();
            mbar_arrive(&s.empty[1][0]);  // the odd tile's left half
            reg_fence_all(o);
            parity ^= 1;
        }
    } else {
        for (int pair = 0; pair < n_pairs; ++pair) {
            logits_half(1, true);
            logits_half(0, false);
            wgmma_wait<0>();
            reg_fence_all(acc);
            float mx0, mx1;
            mask_scale(2 * pair + 1, mx0, mx1);
            named_barrier_sync(kBarMax0, kComputeThreads);
            // WG0's max is finite (its tile has a real key), so the new max is too.
            softmax(fmaxf(s.m[row0], mx0), fmaxf(s.m[row1], mx1));
            __syncwarp();  // the quad's reads of s.m come before this write
            if (c4 == 0) {
                s.m[row0] = m0;
                s.m[row1] = m1;
            }
            named_barrier_arrive(kBarMax1, kComputeThreads);
            pv_own();
            store_p(1.0f, 1.0f);
            named_barrier_sync(kBarP0, kComputeThreads);
            pv_other();
            named_barrier_arrive(kBarP1, kComputeThreads);
            wgmma_wait<1>();
            mbar_arrive(&s.empty[1][1]);  // the odd tile's right half: logits and P·V done
            wgmma_wait<0>();
            mbar_arrive(&s.empty[0][1]);  // the even tile's right half
            reg_fence_all(o);
            parity ^= 1;
        }
    }

    // Row sums: this thread's columns, then the quad, then both warpgroups. Both warpgroups end on
    // the same max (WG0 takes WG1's last).
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    if (c4 == 0) {
        s.sum[wg][row0] = l0;
        s.sum[wg][row1] = l1;
    }
    named_barrier_sync(kBarSum, kComputeThreads);  // also: every MMA reading Q is done

    // Sink in the denominator only: out = O·e^(m−M) / (l·e^(m−M) + e^(sink−M)), M = max(m, sink).
    // The channel pairs (256·wg + 8j + 2c4, +1) go to the staging rows as bf16, those of the RoPE
    // slice as fp32 to the (free) key buffers first: their inverse rotation is a pass of its own,
    // so that no sincosf sits in the unrolled loop beside O's registers.
    const int rope0 = kHeadDim - rope_dim;                      // the first rotated channel
    float* const rope_rows = reinterpret_cast<float*>(s.k[0]);  // [64 rows × rope_dim]
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? row1 : row0;
        float inv = 0.0f;
        if (r < n_q_rows) {
            const float m = half ? m1 : m0, sink = sinks[h0 + r] * kLog2e;
            const float mm = fmaxf(m, sink), f = exp2f(m - mm);
            inv = f / ((s.sum[0][r] + s.sum[1][r]) * f + exp2f(sink - mm));
        }
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int ch = wg * (kHeadDim / 2) + j * 8 + 2 * c4;
            const float a = o[4 * j + 2 * half] * inv, b = o[4 * j + 2 * half + 1] * inv;
            if (ch >= rope0)
                *reinterpret_cast<float2*>(&rope_rows[r * rope_dim + ch - rope0]) = {a, b};
            else
                *reinterpret_cast<uint32_t*>(s.q + swz(r, ch >> 3) + (ch & 7) * 2) = bf16x2(a, b);
        }
    }
    if (rope_dim > 0) {
        named_barrier_sync(kBarRope, kComputeThreads);
        const int pairs = rope_dim / 2;
        for (int x = tid; x < kM * pairs; x += kComputeThreads) {
            const int r = x / pairs, j = x % pairs, ch = rope0 + 2 * j;
            const float2 v = *reinterpret_cast<const float2*>(&rope_rows[r * rope_dim + 2 * j]);
            float a = v.x, b = v.y, cs, sn;
            rope_device::cos_sin(inv_freq, j, static_cast<float>(p), true, cs, sn);
            rope_device::rotate(a, b, cs, sn);
            *reinterpret_cast<uint32_t*>(s.q + swz(r, ch >> 3) + (ch & 7) * 2) = bf16x2(a, b);
        }
    }
    named_barrier_sync(kBarOut, kComputeThreads);
    __nv_bfloat16* out_rows = out + (t * n_heads + h0) * kHeadDim;
    for (int i = tid; i < kM * kChunks; i += kComputeThreads) {
        const int r = i / kChunks, c = i % kChunks;
        if (r < n_q_rows)
            *reinterpret_cast<uint4*>(&out_rows[r * kHeadDim + c * 8]) =
                *reinterpret_cast<const uint4*>(s.q + swz(r, c));
    }
}

}  // namespace

bool attention_wg_supported() { return ::cpfill::cuda::current_device_is_sm90(); }

void attention_wg(const AttnArgs& a, cudaStream_t stream) {
    if (a.n_q == 0) return;
    check_attention_args(a, "attention_wg");
    CPFILL_CHECK(attention_wg_supported(),
                 "attention_wg: this GPU cannot run it (compute capability 9.0 / sm_90a needed)");
    const int smem = static_cast<int>(sizeof(WgSmem)) + 1024;  // + the base's alignment
    CPFILL_CUDA_CHECK(cudaFuncSetAttribute(attention_wg_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t blocks = a.n_q * ((a.n_heads + kM - 1) / kM);
    CPFILL_CHECK(blocks <= 0x7fffffff, "attention_wg: {} queries × head groups in one call",
                 blocks);
    attention_wg_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
        a.q, a.pos, a.n_heads, a.window, a.window0, a.window_size, a.entries, a.n_entries, a.ratio,
        a.entry_idx, a.idx_stride, a.sinks, a.scale, a.out, a.q_norm, a.q_norm_eps, a.rope_dim,
        a.inv_freq);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
