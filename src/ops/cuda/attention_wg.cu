// attention_wg: the attention of ops/cuda/attention.h (AttnArgs) on Hopper's warpgroup MMAs
// (wgmma, bf16 → fp32, sm_90a), warp-specialised. Work items are (query, group of 64 heads; fewer
// heads are padded with zero queries whose rows are never written); a block of three warpgroups
// takes items blockIdx.x, + gridDim.x, … (persistent: one block per multiprocessor; or one item
// per block):
//   WG2 (copies)   per item: the key count (the CSA row's entries, counted by ballots), Q once the
//                  last item's logits are done with it, then the key list (window keys, then
//                  entries) in pairs of 64-key tiles: the even tile of a pair into buffer 0, the
//                  odd one into buffer 1, each as two halves (channels 0–255, 256–511) with their
//                  own mbarriers (full: the cp.async copies of the 128 threads landed; empty: every
//                  MMA reading it done), so a half is refilled as soon as its last reader is done
//                  and the next item's first tiles load during this item's last P·V and output;
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
// 8 compute warps once Q has landed, four rows per warp at a time (norm_rope_q), with the item's
// RoPE angles that the copy warpgroup put in shared memory; the output goes out from the registers
// as bf16, its RoPE pairs (both channels of a pair in one thread) rotated back there with the same
// angles. The schedule follows the one FlashMLA's sparse prefill kernel uses
// (docs/performance-notes.md, session 32).
#include <algorithm>
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
// Registers per thread after the split. setmaxnreg only moves registers within what the block got
// at launch (384 threads × 168, the most __launch_bounds__(384, 1) leaves), so the split must not
// exceed it: with 65,536 (232 / 48) the compute warpgroups' setmaxnreg.inc waited forever (session
// 32's first run). 224 / 56: no spills.
constexpr int kComputeRegs = 224, kCopyRegs = 56;
static_assert(2 * 128 * kComputeRegs + 128 * kCopyRegs <= kThreads * 168,
              "the register split exceeds the launch allocation");
constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks per row
constexpr uint32_t kBlockBytes = 64 * 128;        // one 64-channel block of 64 rows
constexpr uint32_t kHalfBytes = 4 * kBlockBytes;  // 64 rows × 256 channels
constexpr uint32_t kRowsBytes = 8 * kBlockBytes;  // 64 rows × 512 channels (Q, a key tile)

// Named barriers (0 is __syncthreads), each of the two compute warpgroups.
constexpr int kBarQ = 1;           // the prologue's rows written
constexpr int kBarMax0 = 2;        // WG0's new row max in s.m
constexpr int kBarMax1 = 3;        // WG1's new row max (over both tiles) in s.m
constexpr int kBarP0 = 4;          // WG0's P in s.p[0]
constexpr int kBarP1 = 5;          // WG1's P in s.p[1]
constexpr int kBarSum = 6;         // both row sums in s.sum
constexpr int kBarOut = 7;         // the output written
constexpr int kBarCount = 8;       // the copy warpgroup's partial key counts (its 128 threads)
constexpr int kNoRow = INT32_MIN;  // a key past the list (copied as zeros)
constexpr int kMaxRopeDim = 64;    // the RoPE slice, within the last 128-channel block
static_assert(kMaxRopeDim == kWgMaxRopeDim, "attention.h's kWgMaxRopeDim is this kernel's limit");

struct WgSmem {
    alignas(1024) unsigned char q[kRowsBytes];      // Q; the output's staging at the end
    alignas(1024) unsigned char k[2][kRowsBytes];   // a pair's even (0) and odd (1) key tile
    alignas(1024) unsigned char p[2][kBlockBytes];  // each tile's P [64 heads × 64 keys]
    float m[kM];                                    // the row max handed between the warpgroups
    float sum[2][kM];                               // each warpgroup's row sums at the end
    float2 rope_cs[2][kMaxRopeDim / 2];  // RoPE angles (cos, sin) per pair, by item parity
    int count[2][4];                     // the copy warps' key counts, by item parity
    int n_keys;                          // the item's key count (with Q)
    uint64_t q_full;                     // Q landed (and n_keys written)
    uint64_t q_empty;                    // every logits MMA of the item done
    uint64_t full[2][2];                 // [buffer][half] landed
    uint64_t empty[2][2];                // [buffer][half] read by its last MMA
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

// The prologue of an item: Q's per-head RMSNorm (when norm) and RoPE in place, by
// attention_device::norm_rope_rows as attention_tc does it (the same values; the first half's
// channels, never rotated, skip the rotation by (1, 0)). Warp w takes rows w, w + 8, …, all 64
// (padded rows are zeros and stay so), four at a time: a batch's loads, sums and shuffles overlap,
// where one row at a time paid every latency in turn (0.54 → 0.31 ms per 16k queries on an H100:
// docs/performance-notes.md, session 38). The angles: s.rope_cs[which], pairs from channel rope0
// (within 256–511).
__device__ __forceinline__ void norm_rope_q(WgSmem& s, int which, int warp, int lane, int rope0,
                                            bool norm, float eps) {
    constexpr int kWarps = kComputeThreads / 32, kBatch = 4;  // rows in flight per warp
#pragma unroll
    for (int r0 = warp; r0 < kM; r0 += kBatch * kWarps) {
        uint32_t v[kBatch][8];  // a row's 16 channels of this lane as bf16 pairs
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4 u =
                    *reinterpret_cast<const uint4*>(s.q + swz(r0 + j * kWarps, lane + 32 * h));
                v[j][4 * h] = u.x;
                v[j][4 * h + 1] = u.y;
                v[j][4 * h + 2] = u.z;
                v[j][4 * h + 3] = u.w;
            }
        attention_device::norm_rope_rows<kBatch>(v, norm, eps, [&](int k, float& a, float& b) {
            const int c = (k / 4) * kHeadDim / 2 + lane * 8 + 2 * (k % 4);
            if (k >= 4 && c >= rope0) {  // the rotated slice is in the second half
                const float2 t = s.rope_cs[which][(c - rope0) / 2];
                rope_device::rotate(a, b, t.x, t.y);
            }
        });
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint4*>(s.q + swz(r0 + j * kWarps, lane + 32 * h)) =
                    make_uint4(v[j][4 * h], v[j][4 * h + 1], v[j][4 * h + 2], v[j][4 * h + 3]);
        }
    }
}

// A block's work items, item = query × group of 64 heads, taken every gridDim.x-th from blockIdx.x
// (a persistent block takes several: the copies of the next item's Q and first tiles then overlap
// the current item's last P·V and output).
struct Item {
    int64_t t;     // the query
    int h0;        // its first head
    int n_q_rows;  // real heads of the group (the rest are padded zero rows)
};

__device__ __forceinline__ Item item_at(int64_t item, int n_heads) {
    const int n_groups = (n_heads + kM - 1) / kM;
    Item it;
    it.t = item / n_groups;
    it.h0 = static_cast<int>(item % n_groups) * kM;
    it.n_q_rows = n_heads - it.h0 < kM ? n_heads - it.h0 : kM;
    return it;
}

// The key list of query t at position p, counted by the copy warpgroup alone (a CSA row's
// non-negative entries: each warp ballots, the 4 partial counts meet in s.count[slot]).
__device__ KeyList copy_key_list(WgSmem& s, const AttnArgs& a, int64_t t, int64_t p, int slot) {
    KeyList kl;
    kl.window = a.window;
    const int64_t first = p - a.window_size + 1 > 0 ? p - a.window_size + 1 : 0;
    kl.j0 = first - a.window0;
    kl.n_window = p - first + 1;
    kl.entries = a.entries;
    kl.sel = a.entry_idx ? a.entry_idx + t * a.idx_stride : nullptr;
    int64_t n_ent = 0;
    if (kl.sel) {
        const int i = threadIdx.x - kComputeThreads;
        int count = 0;
        for (int64_t i0 = 0; i0 < a.idx_stride; i0 += 128)
            count +=
                __popc(__ballot_sync(0xffffffffu, i0 + i < a.idx_stride && kl.sel[i0 + i] >= 0));
        if ((i & 31) == 0) s.count[slot][i >> 5] = count;
        named_barrier_sync(kBarCount, 128);
        n_ent = s.count[slot][0] + s.count[slot][1] + s.count[slot][2] + s.count[slot][3];
    } else if (a.ratio > 0) {
        n_ent = (p + 1) / a.ratio < a.n_entries ? (p + 1) / a.ratio : a.n_entries;
    }
    kl.n_keys = kl.n_window + n_ent;
    return kl;
}

// The copy warpgroup, per item: the key count (handed to the compute warpgroups with Q), Q once
// its buffer is free, then every pair's two tiles, half by half, in the order the compute
// warpgroups read them (even left, odd right, even right, odd left). Thread i copies 16-byte chunk
// i % 8 of each 64-channel block for rows i / 8 + 16j (j = 0 … 3) of a tile.
__device__ void copy_warpgroup(WgSmem& s, const AttnArgs& a, int64_t n_items) {
    const int i = threadIdx.x - kComputeThreads;
    const int chunk = i & 7, row0 = i >> 3;
    // Destination of (row j, block b) of a buffer: the swizzle of row0 + 16j is row0's.
    const uint32_t dst0 = static_cast<uint32_t>(row0 * 128 + ((chunk ^ (row0 & 7)) << 4));
    uint32_t parity = 1;    // of the empty barriers; a fresh barrier's previous phase is complete
    uint32_t q_parity = 1;  // of q_empty, likewise
    int slot = 0;
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x, slot ^= 1) {
        const Item it = item_at(item, a.n_heads);
        const KeyList kl = copy_key_list(s, a, it.t, a.pos[it.t], slot);
        // 32-bit from here (registers are few in this warpgroup): a window plus one row of
        // entry_idx, or the eligible entries.
        const int n_keys = static_cast<int>(kl.n_keys), n_window = static_cast<int>(kl.n_window);
        const int j0 = static_cast<int>(kl.j0);
        const int32_t* const sel = kl.sel;
        const int n_pairs = (n_keys + 2 * kTile - 1) / (2 * kTile);

        // The item's RoPE angles, one pair per lane of the first warp (all heads are at one
        // position), for the compute warpgroups' prologue and epilogue; computed while the last
        // item's logits run, stored once they are done (the slot of two items back is free then).
        float2 angle = {1.0f, 0.0f};
        if (i < a.rope_dim / 2)
            rope_cos_sin(kHeadDim - a.rope_dim + 2 * i, a.rope_dim, a.inv_freq,
                         static_cast<float>(a.pos[it.t]), false, angle.x, angle.y);

        mbar_wait(&s.q_empty, q_parity);  // every logits MMA of the last item is done
        q_parity ^= 1;
        if (i < a.rope_dim / 2) s.rope_cs[slot][i] = angle;
        __syncwarp();  // the lanes' angles before the first lane's release on q_full
        const __nv_bfloat16* q_rows = a.q + (it.t * a.n_heads + it.h0) * kHeadDim;
        for (int x = i; x < kM * kChunks; x += 128) {
            const int r = x / kChunks, c = x % kChunks;
            const bool valid = r < it.n_q_rows;
            cp_async16(smem_u32(s.q) + swz(r, c), valid ? q_rows + r * kHeadDim + c * 8 : q_rows,
                       valid);
        }
        cp_async_mbar_arrive(&s.q_full);
        if (i == 0) {
            s.n_keys = n_keys;
            mbar_arrive(&s.q_full);  // release: the count is visible once q_full completes
        }

        for (int pair = 0; pair < n_pairs; ++pair) {
            // Each row as one 32-bit value (fewer registers in this warpgroup): an entry's row
            // e ≥ 0, a window row w as −w − 1, a key past the list as kNoRow.
            int rows[2][4];
#pragma unroll
            for (int b = 0; b < 2; ++b)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int key = (2 * pair + b) * kTile + row0 + 16 * j;
                    if (key >= n_keys)
                        rows[b][j] = kNoRow;
                    else if (key < n_window)
                        rows[b][j] = -(j0 + key) - 1;
                    else
                        rows[b][j] = sel ? sel[key - n_window] : key - n_window;
                }
            auto copy_half = [&](int b, int half) __attribute__((always_inline)) {
                mbar_wait(&s.empty[b][half], parity);
                const uint32_t base = smem_u32(s.k[b]) + half * kHalfBytes + dst0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int r = rows[b][j];
                    const __nv_bfloat16* src =
                        (r >= 0 ? a.entries + static_cast<int64_t>(r) * kHeadDim
                                : a.window +
                                      static_cast<int64_t>(r == kNoRow ? 0 : -r - 1) * kHeadDim) +
                        chunk * 8 + half * (kHeadDim / 2);
#pragma unroll
                    for (int blk = 0; blk < 4; ++blk)
                        cp_async16(base + blk * kBlockBytes + j * 16 * 128, src + blk * 64,
                                   r != kNoRow);
                }
                cp_async_mbar_arrive(&s.full[b][half]);
            };
            copy_half(0, 0);
            copy_half(1, 1);
            copy_half(0, 1);
            copy_half(1, 0);
            parity ^= 1;
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_wg_kernel(const __grid_constant__ AttnArgs a, int64_t n_items) {
    extern __shared__ unsigned char smem_raw[];
    WgSmem& s = *reinterpret_cast<WgSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                           ~uintptr_t{1023});
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        mbar_init(&s.q_full, 128 + 1);  // the copies of 128 threads, and the key count
        mbar_init(&s.q_empty, kComputeThreads);
        for (int b = 0; b < 2; ++b)
            for (int h = 0; h < 2; ++h) {
                mbar_init(&s.full[b][h], 128);
                mbar_init(&s.empty[b][h], 128);
            }
        mbar_init_fence();
    }
    __syncthreads();  // the barriers' init before any arrival

    if (wg == 2) {
        setmaxnreg_dec<kCopyRegs>();
        copy_warpgroup(s, a, n_items);
        return;
    }
    setmaxnreg_inc<kComputeRegs>();

    const int wt = tid & 127, lane = tid & 31, c4 = lane & 3;
    const int row0 = (wt >> 5) * 16 + (lane >> 2), row1 = row0 + 8;  // this thread's rows
    const float scale_log2 = a.scale * kLog2e;
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
    const int rope0 = kHeadDim - a.rope_dim;  // the first rotated channel

    uint32_t parity = 0, q_parity = 0;  // of the full barriers (per pair) and q_full (per item)
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const Item it = item_at(item, a.n_heads);
        mbar_wait(&s.q_full, q_parity);
        q_parity ^= 1;  // now the next item's parity: q_parity ^ 1 is this one's (its s.rope_cs)
        const int n_keys = s.n_keys;
        const int n_pairs = (n_keys + 2 * kTile - 1) / (2 * kTile);
        if (a.q_norm || a.rope_dim > 0) {
            norm_rope_q(s, q_parity ^ 1, tid >> 5, lane, rope0, a.q_norm, a.q_norm_eps);
            fence_proxy_async_shared();  // the rows → wgmma's reads
            named_barrier_sync(kBarQ, kComputeThreads);
        }

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float acc[32];
        uint32_t pa[4][4];
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
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
        // This warpgroup's tile's logits, the half the copies land first first (WG0: channels
        // 0–255, WG1: 256–511), waited for; after the item's last pair's, Q is free for the next
        // item.
        auto logits = [&](bool last_pair) __attribute__((always_inline)) {
            if (wg == 0) {  // constant halves: the descriptors' offsets stay compile-time
                logits_half(0, true);
                logits_half(1, false);
            } else {
                logits_half(1, true);
                logits_half(0, false);
            }
            wgmma_wait<0>();
            reg_fence_all(acc);
            if (last_pair) mbar_arrive(&s.q_empty);
        };
        // The running max (m0, m1) into s.m for the other warpgroup; the quad's reads of s.m
        // (this pair's or the last) come before this write.
        auto publish_max = [&]() __attribute__((always_inline)) {
            __syncwarp();
            if (c4 == 0) {
                s.m[row0] = m0;
                s.m[row1] = m1;
            }
        };
        // The logits in the log2 domain, −∞ past the list; returns the rows' tile maxima.
        auto mask_scale = [&](int tile, float& mx0, float& mx1) __attribute__((always_inline)) {
            const int n_valid = n_keys - tile * kTile;
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
        // P = 2^(S − m) in place (fp32), the rounded values' sums into l (after l · alpha), O ·
        // alpha.
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
            scale_o(alpha0,
                    alpha1);  // unconditionally: a branch here costs registers (copies of O)
        };
        // O += P (registers, bf16: pa, the A fragments of the 4 k-steps) · this warpgroup's half of
        // its own tile's V.
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
        // P · f (bf16, from pa: f = 1 keeps it exact) into this warpgroup's P tile for the other
        // one's P·V. Column block j of the tile is k-step j / 2's registers 0, 1 (j even) or 2, 3.
        auto store_p = [&](float f0, float f1) __attribute__((always_inline)) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float2 lo = unpack_bf16x2(pa[j >> 1][2 * (j & 1)]);
                const float2 hi = unpack_bf16x2(pa[j >> 1][2 * (j & 1) + 1]);
                *reinterpret_cast<uint32_t*>(p_own + row0 * 128 + ((j ^ (row0 & 7)) << 4) +
                                             4 * c4) = bf16x2(lo.x * f0, lo.y * f0);
                *reinterpret_cast<uint32_t*>(p_own + row1 * 128 + ((j ^ (row1 & 7)) << 4) +
                                             4 * c4) = bf16x2(hi.x * f1, hi.y * f1);
            }
            fence_proxy_async_shared();  // P → the other warpgroup's wgmma reads
        };
        // O += P_other (shared memory) · this warpgroup's half of the other tile's V.
        auto pv_other = [&]() __attribute__((always_inline)) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wgmma_m64n256k16_bf16<1>(o, p_other + kk * 2, v_other + kk * 128, 1);
            wgmma_commit();
        };

        if (wg == 0) {
            for (int pair = 0; pair < n_pairs; ++pair) {
                logits(pair + 1 == n_pairs);
                float mx0, mx1;
                mask_scale(2 * pair, mx0, mx1);
                // Tile 2·pair has a real key in column 0: the new max is finite.
                softmax(fmaxf(m0, mx0), fmaxf(m1, mx1));
                publish_max();
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
                logits(pair + 1 == n_pairs);
                float mx0, mx1;
                mask_scale(2 * pair + 1, mx0, mx1);
                named_barrier_sync(kBarMax0, kComputeThreads);
                // WG0's max is finite (its tile has a real key), so the new max is too.
                softmax(fmaxf(s.m[row0], mx0), fmaxf(s.m[row1], mx1));
                publish_max();
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

        // Row sums: this thread's columns, then the quad, then both warpgroups. Both warpgroups end
        // on the same max (WG0 takes WG1's last).
        l0 = quad_sum(l0);
        l1 = quad_sum(l1);
        if (c4 == 0) {
            s.sum[wg][row0] = l0;
            s.sum[wg][row1] = l1;
        }
        named_barrier_sync(kBarSum, kComputeThreads);  // also: every MMA reading P is done

        // Sink in the denominator only: out = O·e^(m−M) / (l·e^(m−M) + e^(sink−M)), M = max(m,
        // sink). The channel pairs (256·wg + 8j + 2c4, +1) go out as bf16 straight from the
        // registers (the Q buffer may already hold the next item's Q); a pair of the RoPE slice is
        // rotated back first, with the item's angles (s.rope_cs, written before q_full).
        __nv_bfloat16* const out_rows = a.out + (it.t * a.n_heads + it.h0) * kHeadDim;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = half ? row1 : row0;
            if (r < it.n_q_rows) {
                const float m = half ? m1 : m0, sink = a.sinks[it.h0 + r] * kLog2e;
                const float mm = fmaxf(m, sink), f = exp2f(m - mm);
                const float inv = f / ((s.sum[0][r] + s.sum[1][r]) * f + exp2f(sink - mm));
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    const int ch = wg * (kHeadDim / 2) + j * 8 + 2 * c4;
                    float x = o[4 * j + 2 * half] * inv, y = o[4 * j + 2 * half + 1] * inv;
                    // (j first: compile-time, only the last kMaxRopeDim channels can be rotated)
                    if (j * 8 >= kHeadDim / 2 - kMaxRopeDim && ch >= rope0) {
                        const float2 cs = s.rope_cs[q_parity ^ 1][(ch - rope0) / 2];
                        rope_device::rotate(x, y, cs.x, -cs.y);
                    }
                    *reinterpret_cast<uint32_t*>(&out_rows[r * kHeadDim + ch]) = bf16x2(x, y);
                }
            }
        }
        named_barrier_sync(kBarOut, kComputeThreads);  // s.sum is free again
    }
}

}  // namespace

bool attention_wg_supported() { return ::cpfill::cuda::current_device_is_sm90(); }

void attention_wg(const AttnArgs& a, cudaStream_t stream, bool persistent) {
    if (a.n_q == 0) return;
    check_attention_args(a, "attention_wg");
    CPFILL_CHECK(a.rope_dim <= kMaxRopeDim, "attention_wg: rope_dim {} (at most {})", a.rope_dim,
                 kMaxRopeDim);
    CPFILL_CHECK(attention_wg_supported(),
                 "attention_wg: this GPU cannot run it (compute capability 9.0 / sm_90a needed)");
    const int smem = static_cast<int>(sizeof(WgSmem)) + 1024;  // + the base's alignment
    CPFILL_CUDA_CHECK(cudaFuncSetAttribute(attention_wg_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t items = a.n_q * ((a.n_heads + kM - 1) / kM);
    int device = 0, sms = 0;
    CPFILL_CUDA_CHECK(cudaGetDevice(&device));
    CPFILL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int64_t blocks = persistent ? std::min<int64_t>(items, sms) : items;
    CPFILL_CHECK(blocks <= 0x7fffffff, "attention_wg: {} queries × head groups in one call",
                 blocks);
    attention_wg_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(a, items);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
