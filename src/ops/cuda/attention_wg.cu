// attention_wg: the attention of ops/cuda/attention.h (AttnArgs) on Hopper's warpgroup MMAs
// (wgmma, bf16 → fp32, sm_90a). One block of two warpgroups per (query, group of 64 heads); the
// query's key list (window keys, then entries) streams through a ring of kStages = 3 shared tiles
// of kTile = 48 keys by cp.async, two tiles ahead of the one computed (every thread copies 16-byte
// chunks of 12 rows; the CSA entry_idx values of a tile are staged in shared memory two tiles
// before its rows are copied, so row addresses never wait on global loads). The window rows of the
// first two tiles are copied before the key list is counted (they need only the position).
//
// Shared tiles are K-major rows of 128 bytes in the 128-byte swizzle (8 blocks of 64 channels):
// Q [64 heads × 512], each key tile [48 keys × 512] (K = V) and P [64 heads × 48 keys, in 64
// columns]. A key tile is the B operand of both products: K-major for S = Q·Kᵀ, and MN-major
// (transposed) for O += P·V, where the 64-channel blocks are the MN atoms, 6144 bytes apart.
// Descriptors are built once per block and moved by adding to their address field.
//
// Per tile, warpgroup w ∈ {0, 1}:
//   logits   S_w[64 heads, 24 keys] = Q · K[24w … 24w + 23]ᵀ (32 wgmma m64n24k16 over the 512
//            channels), masked past the list, in the log2 domain; the next copies are issued
//            while these MMAs run;
//   softmax  online, fp32: the row maxima of both halves meet in shared memory; every thread keeps
//            the running max m of its two rows (both warpgroups compute the same values) and its
//            partial row sum l over its own columns (of the bf16-rounded probabilities, so
//            numerator and denominator agree), rescaled by e^(m_old − m_new) each tile;
//   P        written as bf16 into its 24 columns of P;
//   P·V      O_w[64 heads, channels 256w … 256w + 255] += P · V (3 wgmma m64n256k16), O in fp32
//            registers (128 per thread), rescaled first.
// Three block barriers per tile: the tile has landed (and the tile before it is free), the maxima,
// the P tile. Padded heads (beyond n_heads) are zero queries whose rows are never written; keys
// beyond the list are zero rows with logit −∞. The epilogue adds the two warpgroups' row sums and
// the sink (denominator only), applies the inverse RoPE in fp32 and stages the bf16 output in the
// (free) Q buffer for coalesced stores. The optional prologue (q_norm, rope_dim) is
// attention_tc's: one warp per head row once Q has landed, while the key tiles are in flight.
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

constexpr int kM = 64;                     // heads per block (wgmma's M)
constexpr int kTile = 48;                  // keys per tile
constexpr int kStages = 3;                 // key tiles in shared memory
constexpr int kSelSlots = 4;               // staged entry_idx rows (two tiles ahead of the copies)
constexpr int kThreads = 256;              // two warpgroups
constexpr int kKeysPerWg = kTile / 2;      // logits: keys of a warpgroup
constexpr int kDimsPerWg = kHeadDim / 2;   // P·V: output channels of a warpgroup
constexpr int kChunks = kHeadDim / 8;      // 16-byte chunks per row
constexpr uint32_t kQBlock = kM * 128;     // Q's (and P's) 64-channel block: 64 rows × 128 bytes
constexpr uint32_t kKBlock = kTile * 128;  // a key tile's 64-channel block
constexpr uint32_t kKBytes = 8 * kKBlock;

struct WgSmem {
    alignas(1024) unsigned char q[8 * kQBlock];  // Q; the output's staging at the end
    alignas(1024) unsigned char k[kStages][kKBytes];
    alignas(1024) unsigned char p[kQBlock];  // P [64 heads × 48 keys] in 64 columns
    float red_max[2][kM];                    // each warpgroup's row maxima of this tile
    float red_sum[2][kM];                    // each warpgroup's row sums at the end
    int32_t sel[kSelSlots][kTile];           // entry_idx values of coming tiles, slot = tile % 4
};

// Byte offset of 16-byte chunk c (0 … 63) of row r in a swizzled [rows × 512 channels] tile whose
// 64-channel blocks are `block` bytes apart.
__device__ __forceinline__ uint32_t swz(int r, int c, uint32_t block) {
    return (c >> 3) * block + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Starts the copy of the rows of keys k0 … k0 + kTile − 1 of the list into dst: the window rows
// (key < n_window) when `window_rows`, the others (entries; zeros past the list) when
// `other_rows`. Thread i copies chunk i % 64 of rows i / 64, i / 64 + 4, …: a warp reads 512
// contiguous bytes. CSA entry rows come from sel_tile (staged by prefetch_sel) or, when it is
// null, from kl.sel. Key counts fit 32 bits (a window plus one row of entry_idx, or the eligible
// entries), so the per-row work is 32-bit but for the final address.
__device__ __forceinline__ void load_rows(unsigned char* dst, const KeyList& kl, int k0,
                                          const int32_t* sel_tile, bool window_rows,
                                          bool other_rows) {
    const int c = threadIdx.x & 63;
    const uint32_t base = smem_u32(dst);
    const int n_window = static_cast<int>(kl.n_window), n_keys = static_cast<int>(kl.n_keys);
    const __nv_bfloat16* wrow0 = kl.window + kl.j0 * kHeadDim + c * 8;
    const __nv_bfloat16* erow0 = kl.entries + c * 8;
#pragma unroll 4
    for (int r = threadIdx.x >> 6; r < kTile; r += kThreads / 64) {
        const int key = k0 + r;
        if (key < n_window) {
            if (window_rows) cp_async16(base + swz(r, c, kKBlock), wrow0 + key * kHeadDim, true);
        } else if (other_rows) {
            const __nv_bfloat16* src = kl.window;
            if (key < n_keys) {
                const int e = key - n_window;
                const int er = kl.sel ? (sel_tile ? sel_tile[r] : kl.sel[e]) : e;
                src = erow0 + static_cast<int64_t>(er) * kHeadDim;
            }
            cp_async16(base + swz(r, c, kKBlock), src, key < n_keys);
        }
    }
}

// Starts the copy of the entry_idx values of keys k0 … k0 + kTile − 1 (entry keys only) into dst.
__device__ __forceinline__ void prefetch_sel(int32_t* dst, const KeyList& kl, int64_t k0) {
    const int i = threadIdx.x;
    const int64_t key = k0 + i;
    if (kl.sel && i < kTile && key >= kl.n_window && key < kl.n_keys)
        cp_async4(smem_u32(dst + i), kl.sel + (key - kl.n_window));
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_wg_kernel(const __nv_bfloat16* q, const int64_t* pos, int n_heads,
                        const __nv_bfloat16* window, int window_size, const __nv_bfloat16* entries,
                        int64_t n_entries, int ratio, const int32_t* entry_idx, int64_t idx_stride,
                        const float* sinks, float scale, __nv_bfloat16* out, bool q_norm,
                        float q_norm_eps, int rope_dim, const float* inv_freq) {
    extern __shared__ unsigned char smem_raw[];
    WgSmem& s = *reinterpret_cast<WgSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                           ~uintptr_t{1023});
    const int n_groups = (n_heads + kM - 1) / kM;
    const int64_t t = blockIdx.x / n_groups;
    const int h0 = static_cast<int>(blockIdx.x % n_groups) * kM;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int row0 = ((tid & 127) >> 5) * 16 + g, row1 = row0 + 8;  // this thread's fragment rows
    const int64_t p = pos[t];

    // Group 0: Q and the window rows of tiles 0 and 1 (they need only the position); group 1:
    // the other rows of tile 0 and the entry_idx values of tiles 2 and 3; group 2: the other rows
    // of tile 1. The loop then commits one group per tile and waits for all but the newest.
    {
        const int c = tid & 63;
        for (int r = tid >> 6; r < kM; r += kThreads / 64) {
            const bool valid = h0 + r < n_heads;
            const __nv_bfloat16* src = valid ? q + (t * n_heads + h0 + r) * kHeadDim + c * 8 : q;
            cp_async16(smem_u32(s.q) + swz(r, c, kQBlock), src, valid);
        }
        KeyList w{};
        w.window = window;
        w.j0 = p - window_size + 1 > 0 ? p - window_size + 1 : 0;
        w.n_window = w.n_keys = p - w.j0 + 1;
        load_rows(s.k[0], w, 0, nullptr, true, false);
        load_rows(s.k[1], w, kTile, nullptr, true, false);
    }
    cp_async_commit();
    const KeyList kl =
        key_list(p, t, window, window_size, entries, n_entries, ratio, entry_idx, idx_stride);
    const int n_tiles = static_cast<int>((kl.n_keys + kTile - 1) / kTile);
    load_rows(s.k[0], kl, 0, nullptr, false, true);
    prefetch_sel(s.sel[2], kl, 2 * kTile);
    prefetch_sel(s.sel[3], kl, 3 * kTile);
    cp_async_commit();
    load_rows(s.k[1], kl, kTile, nullptr, false, true);
    cp_async_commit();
    if (q_norm || rope_dim > 0) {
        cp_async_wait<2>();  // this thread's Q copies (tiles 0 and 1 may still be in flight)
        __syncthreads();
        const int n_rows = n_heads - h0 < kM ? n_heads - h0 : kM;  // padded rows stay zero
        const LaneRope rope = lane_rope(lane, rope_dim, inv_freq, static_cast<float>(p));
        for (int r = tid >> 5; r < n_rows; r += kThreads / 32)
            norm_rope_row(reinterpret_cast<uint4*>(s.q + swz(r, lane, kQBlock)),
                          reinterpret_cast<uint4*>(s.q + swz(r, lane + 32, kQBlock)), q_norm,
                          q_norm_eps, rope);
    }

    const float scale_log2 = scale * kLog2e;
    // Descriptors are built once: moving along a tile adds (bytes >> 4) to the start address
    // field, which never carries out of it (shared addresses are below 2^18).
    const uint64_t q_desc = wgmma_desc_sw128_lbo(smem_u32(s.q), 16);
    const uint64_t p_desc = wgmma_desc_sw128_lbo(smem_u32(s.p), 16);
    // This warpgroup's keys (logits) and channels (P·V) in stage 0; stage b adds b · kKBytes.
    const uint64_t k_desc0 = wgmma_desc_sw128_lbo(smem_u32(s.k[0]) + wg * kKeysPerWg * 128, 16);
    const uint64_t v_desc0 =
        wgmma_desc_sw128_lbo(smem_u32(s.k[0]) + wg * (kDimsPerWg / 64) * kKBlock, kKBlock);
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int it = 0, stage = 0; it < n_tiles; ++it, stage = stage == kStages - 1 ? 0 : stage + 1) {
        cp_async_wait<1>();          // every group but the newest (tile it + 1's)
        fence_proxy_async_shared();  // the copies (and the prologue) → wgmma's reads
        __syncthreads();  // tile `it` visible; every warp is done with tile it − 1 and with P
        const uint64_t kd = k_desc0 + stage * (kKBytes >> 4), vd = v_desc0 + stage * (kKBytes >> 4);

        // Logits of this warpgroup's 24 keys, issued before the copies of tile it + 2 (into the
        // stage tile it − 1 has left) so that the tensor cores work while the threads compute the
        // rows' addresses.
        float acc[12];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const uint32_t qoff = ((kk >> 2) * kQBlock + (kk & 3) * 32) >> 4;
            const uint32_t koff = ((kk >> 2) * kKBlock + (kk & 3) * 32) >> 4;
            wgmma_m64n24k16_bf16(acc, q_desc + qoff, kd + koff, kk);
        }
        wgmma_commit();
        if (it + 2 < n_tiles) {
            const int next = stage == 0 ? kStages - 1 : stage - 1;  // (it + 2) % kStages
            load_rows(s.k[next], kl, (it + 2) * kTile, s.sel[(it + 2) % kSelSlots], true, true);
            prefetch_sel(s.sel[it % kSelSlots], kl, static_cast<int64_t>(it + 4) * kTile);
        }
        cp_async_commit();  // one group per tile, empty or not, for the wait's count
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 12; ++i) reg_fence(acc[i]);

        const int64_t left = kl.n_keys - static_cast<int64_t>(it) * kTile;
        const int n_valid = left < kTile ? static_cast<int>(left) : kTile;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeysPerWg / 8; ++j) {
            const int col = wg * kKeysPerWg + j * 8 + 2 * c4;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = col + (e & 1) < n_valid;
                acc[4 * j + e] = ok ? acc[4 * j + e] * scale_log2 : -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(acc[4 * j], acc[4 * j + 1]));
            mx1 = fmaxf(mx1, fmaxf(acc[4 * j + 2], acc[4 * j + 3]));
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        if (c4 == 0) {
            s.red_max[wg][row0] = mx0;
            s.red_max[wg][row1] = mx1;
        }
        __syncthreads();  // both halves' maxima

        // Column 0 of every tile is a real key: the new max is finite and 2^(−∞ − m) = 0.
        const float new0 = fmaxf(m0, fmaxf(s.red_max[0][row0], s.red_max[1][row0]));
        const float new1 = fmaxf(m1, fmaxf(s.red_max[0][row1], s.red_max[1][row1]));
        const float alpha0 = exp2f(m0 - new0), alpha1 = exp2f(m1 - new1);
        m0 = new0;
        m1 = new1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeysPerWg / 8; ++j) {
            const __nv_bfloat162 lo = __floats2bfloat162_rn(fast_exp2(acc[4 * j] - new0),
                                                            fast_exp2(acc[4 * j + 1] - new0));
            const __nv_bfloat162 hi = __floats2bfloat162_rn(fast_exp2(acc[4 * j + 2] - new1),
                                                            fast_exp2(acc[4 * j + 3] - new1));
            const int chunk = wg * (kKeysPerWg / 8) + j, in_chunk = 4 * c4;
            *reinterpret_cast<__nv_bfloat162*>(s.p + row0 * 128 + ((chunk ^ (row0 & 7)) << 4) +
                                               in_chunk) = lo;
            *reinterpret_cast<__nv_bfloat162*>(s.p + row1 * 128 + ((chunk ^ (row1 & 7)) << 4) +
                                               in_chunk) = hi;
            const float2 lo_f = __bfloat1622float2(lo), hi_f = __bfloat1622float2(hi);
            sum0 += lo_f.x + lo_f.y;
            sum1 += hi_f.x + hi_f.y;
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
        if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                o[4 * j] *= alpha0;
                o[4 * j + 1] *= alpha0;
                o[4 * j + 2] *= alpha1;
                o[4 * j + 3] *= alpha1;
            }
        }
        fence_proxy_async_shared();  // P → wgmma's reads
        __syncthreads();             // both halves of P

        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk)
            wgmma_m64n256k16_bf16_bmn(o, p_desc + kk * 2, vd + kk * (16 * 128 >> 4), 1);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) reg_fence(o[i]);
    }

    cp_async_wait<0>();  // copies no tile needed (tile 1's rows when there is one tile)

    // Row sums: this thread's columns, then the quad, then both warpgroups.
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    if (c4 == 0) {
        s.red_sum[wg][row0] = l0;
        s.red_sum[wg][row1] = l1;
    }
    __syncthreads();  // the row sums; every warp is done with Q (it becomes the output's staging)

    // Sink in the denominator only: out = O·e^(m−M) / (l·e^(m−M) + e^(sink−M)), M = max(m, sink).
    // Then the inverse RoPE of the channel pairs (256w + 8j + 2c4, +1).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? row1 : row0;
        float inv = 0.0f;
        if (h0 + r < n_heads) {
            const float m = half ? m1 : m0, sink = sinks[h0 + r] * kLog2e;
            const float mm = fmaxf(m, sink), f = exp2f(m - mm);
            inv = f / ((s.red_sum[0][r] + s.red_sum[1][r]) * f + exp2f(sink - mm));
        }
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int ch = wg * kDimsPerWg + j * 8 + 2 * c4;
            float cs, sn;
            rope_cos_sin(ch, rope_dim, inv_freq, static_cast<float>(p), true, cs, sn);
            float a = o[4 * j + 2 * half] * inv, b = o[4 * j + 2 * half + 1] * inv;
            rope_device::rotate(a, b, cs, sn);
            *reinterpret_cast<__nv_bfloat162*>(s.q + swz(r, ch >> 3, kQBlock) + (ch & 7) * 2) =
                __floats2bfloat162_rn(a, b);
        }
    }
    __syncthreads();
    for (int i = tid; i < kM * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        if (h0 + r < n_heads)
            *reinterpret_cast<uint4*>(&out[(t * n_heads + h0 + r) * kHeadDim + c * 8]) =
                *reinterpret_cast<const uint4*>(s.q + swz(r, c, kQBlock));
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
        a.q, a.pos, a.n_heads, a.window, a.window_size, a.entries, a.n_entries, a.ratio,
        a.entry_idx, a.idx_stride, a.sinks, a.scale, a.out, a.q_norm, a.q_norm_eps, a.rope_dim,
        a.inv_freq);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
