// indexer_topk: two kernels per chunk of queries (a chunk's scores fill the scratch). On Hopper the
// scores come from ops/cuda/indexer_hopper.cu (bf16 operands as they are; with
// IndexerPrecision::Fp8 the keys quantised once per call and the chunk's queries before its
// scoring, both into the same scratch: Fp8Layout). Elsewhere (and with IndexerArgs::mma_sync):
//   scores  tensor cores, mma.sync m16n8k16 bf16 → fp32. A block of 8 warps owns 8 consecutive
//           queries (warp w: query w) and up to kSplit = 2048 entries of them; each warp keeps its
//           query's Q [64 heads, 128 dims] in registers as the B operand (128 registers, loaded
//           once) while key tiles of 128 entries stream through shared memory (3 stages, cp.async)
//           as the A operand (ldmatrix). Per 16 keys a warp forms S[16 keys, 64 heads] in fp32
//           registers (64 MMAs), then score = scale · Σ_h weight_h · ReLU(S[key, h]): 16 heads in
//           each thread, then across the 4 threads of a quad by shuffles; no shared-memory round
//           trip. Fewer heads or dims are zero-padded to 64 × 128 (zero Q, zero weight, zero key
//           columns), so every shape runs the same code.
//   top-k   one block per query: radix select of the k-th largest score over an order-preserving
//           uint32 image of the floats, 3 passes of 11, 11 and 10 bits; the first reads the scores
//           once and keeps the images of the first kTopkCache entries in shared memory for the
//           other passes. Then an ordered compaction (each warp a contiguous slice, ballots for the
//           order inside it) keeps every larger score and the lowest-indexed equal ones — the
//           CPU's set (score desc, index asc) — written in ascending entry order.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/indexer.h"
#include "ops/cuda/indexer_device.cuh"
#include "ops/cuda/indexer_hopper.h"
#include "ops/cuda/ptx.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kMaxHeads = 64;
constexpr int kMaxDim = 128;
constexpr int kHeadTiles = kMaxHeads / 8;  // n-tiles of the MMAs (8 heads each)
constexpr int kDimSteps = kMaxDim / 16;    // k-steps of the MMAs
constexpr int kQueries = 8;                // queries per scoring block, one per warp
constexpr int kScoreThreads = kQueries * 32;
constexpr int kTile = 128;        // keys per shared-memory stage
constexpr int kStages = 3;        // cp.async pipeline depth
constexpr int kSplit = 2048;      // entries per scoring block (a multiple of kTile)
constexpr int kLd = kMaxDim + 8;  // padded key row (bf16): ldmatrix rows fall in distinct banks

constexpr int kTopkThreads = 512;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kBins = 2048;        // radix digits of 11, 11 and 10 bits
constexpr int kTopkCache = 24576;  // order keys kept in shared memory (96 KB)

struct ScoreSmem {
    alignas(16) __nv_bfloat16 k[kStages][kTile][kLd];  // key tiles, columns ≥ dim zero
    float w[kQueries][kMaxHeads];                      // head weights, zero beyond n_heads
};

// Starts the copy of keys k0 … k0 + kTile − 1 into dst (all threads); keys ≥ k_end become zeros.
// Each warp copies two rows at a time, a lane one 16-byte chunk (lanes past dim / 8 idle).
__device__ __forceinline__ void load_keys(__nv_bfloat16 (*dst)[kLd], const __nv_bfloat16* keys,
                                          int dim, int64_t k0, int64_t k_end) {
    const int lane = threadIdx.x & 31, c = (lane & 15) * 8;
    if (c >= dim) return;
    constexpr int kRowsPerStep = kScoreThreads / 16;
#pragma unroll 4
    for (int r = static_cast<int>(threadIdx.x >> 4); r < kTile; r += kRowsPerStep) {
        const bool valid = k0 + r < k_end;
        const __nv_bfloat16* src = valid ? keys + (k0 + r) * dim + c : keys;
        cp_async16(smem_u32(&dst[r][c]), src, valid);
    }
}

// grid: (query groups of kQueries) × (entry splits of kSplit), split fastest. t indexes the
// chunk; scores row stride = n_entries.
__global__ void __launch_bounds__(kScoreThreads, 1)
    score_kernel(const __nv_bfloat16* q, const float* weight, const int64_t* pos, int64_t rows,
                 int n_heads, int dim, const __nv_bfloat16* keys, int64_t n_entries, int ratio,
                 float scale, int n_splits, float* scores) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    ScoreSmem& s = *reinterpret_cast<ScoreSmem*>(smem_raw);
    const int64_t t0 = static_cast<int64_t>(blockIdx.x / n_splits) * kQueries;
    const int64_t e0 = static_cast<int64_t>(blockIdx.x % n_splits) * kSplit;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    int64_t n_blk = 0, n_own = 0;  // eligible entries: the block's most, this warp's query's
    for (int j = 0; j < kQueries; ++j) {
        const int64_t n = t0 + j < rows ? n_eligible(pos[t0 + j], ratio, n_entries) : 0;
        n_blk = n > n_blk ? n : n_blk;
        if (j == warp) n_own = n;
    }
    if (e0 >= n_blk) return;
    const int64_t e1 = e0 + kSplit < n_blk ? e0 + kSplit : n_blk;
    const int n_tiles = static_cast<int>((e1 - e0 + kTile - 1) / kTile);
    for (int st = 0; st < kStages - 1; ++st) {
        if (st < n_tiles) load_keys(s.k[st], keys, dim, e0 + st * kTile, e1);
        cp_async_commit();
    }
    const int pad = (kMaxDim - dim) / 8;  // zero the key columns ≥ dim once (plain stores)
    for (int i = tid; i < kStages * kTile * pad; i += kScoreThreads)
        *reinterpret_cast<uint4*>(&s.k[0][0][0] + (i / pad) * kLd + dim + (i % pad) * 8) =
            make_uint4(0, 0, 0, 0);

    // This warp's query as B fragments: b0 = Q[8nt + g][16ks + 2c4, +1], b1 the same at + 8.
    const int64_t t = t0 + warp;
    const bool active = n_own > e0;
    uint32_t qb[kHeadTiles][kDimSteps][2];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
        const int h = nt * 8 + g;
        const bool head = active && h < n_heads;
        const uint32_t* row = reinterpret_cast<const uint32_t*>(
            q + (head ? (t * n_heads + h) * static_cast<int64_t>(dim) : 0));
#pragma unroll
        for (int ks = 0; ks < kDimSteps; ++ks) {
            const bool valid = head && ks * 16 < dim;
            qb[nt][ks][0] = valid ? row[ks * 8 + c4] : 0u;
            qb[nt][ks][1] = valid ? row[ks * 8 + 4 + c4] : 0u;
        }
    }
    for (int h = lane; h < kMaxHeads; h += 32)
        s.w[warp][h] = active && h < n_heads ? weight[t * n_heads + h] : 0.0f;
    float* out = scores + t * n_entries;
    // A (keys): lanes 0–15 rows 0–15 at column 0, lanes 16–31 the same rows at column 8.
    const uint32_t a_lane = static_cast<uint32_t>(((lane & 15) * kLd + (lane >> 4) * 8) * 2);

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // tile it visible; every warp is done with tile it − 1's stage
        const int next = it + kStages - 1;
        if (next < n_tiles) load_keys(s.k[next % kStages], keys, dim, e0 + next * kTile, e1);
        cp_async_commit();
        const int64_t k0 = e0 + static_cast<int64_t>(it) * kTile;
        if (!active || k0 >= n_own) continue;
        const int64_t left = (n_own - k0 + 15) / 16;
        const int n_sub = left < kTile / 16 ? static_cast<int>(left) : kTile / 16;
        const uint32_t a_tile = smem_u32(&s.k[it % kStages][0][0]) + a_lane;
#pragma unroll 1
        for (int j = 0; j < n_sub; ++j) {
            float acc[kHeadTiles][4] = {};
#pragma unroll
            for (int ks = 0; ks < kDimSteps; ++ks) {
                uint32_t a[4];
                ldsm_x4(a, a_tile + (j * 16 * kLd + ks * 16) * 2);
#pragma unroll
                for (int nt = 0; nt < kHeadTiles; ++nt)
                    mma_bf16(acc[nt], a, qb[nt][ks][0], qb[nt][ks][1]);
            }
            // acc[nt][0, 1]: key 16j + g, heads 8nt + 2c4, + 1; acc[nt][2, 3]: key 16j + g + 8.
            float lo = 0.0f, hi = 0.0f;
#pragma unroll
            for (int nt = 0; nt < kHeadTiles; ++nt) {
                const float2 w = *reinterpret_cast<const float2*>(&s.w[warp][nt * 8 + 2 * c4]);
                lo += w.x * fmaxf(acc[nt][0], 0.0f) + w.y * fmaxf(acc[nt][1], 0.0f);
                hi += w.x * fmaxf(acc[nt][2], 0.0f) + w.y * fmaxf(acc[nt][3], 0.0f);
            }
            lo = quad_sum(lo);
            hi = quad_sum(hi);
            // Lanes c4 = 0 write keys g, lanes c4 = 1 keys g + 8: 16 consecutive floats.
            const int64_t key = k0 + j * 16 + g + (c4 & 1) * 8;
            if (c4 < 2 && key < n_own) out[key] = (c4 ? hi : lo) * scale;
        }
    }
}

// Order-preserving image of a float (larger float → larger uint); −0 and +0 map alike.
__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    if (f == 0.0f) return 0x80000000u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The order key of entry i: from the shared-memory cache or from the scores.
__device__ __forceinline__ uint32_t key_at(const uint32_t* cache, int n_cached, const float* s,
                                           int i) {
    return i < n_cached ? cache[i] : order_key(s[i]);
}

// Finds the bin of hist[0, n_bins) (counted from the top) that holds the remaining-th largest key
// and how many of it are still to take; every thread must call it and reads *bin / *rem after.
// warp_tot: shared [kTopkWarps].
__device__ __forceinline__ void find_bin(const unsigned* hist, int n_bins, int remaining,
                                         int* warp_tot, int* bin, int* rem) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = n_bins / kTopkThreads;  // this thread's bins: top, top − 1, …, top − per + 1
    const int top = n_bins - 1 - tid * per;
    int c = 0;
    for (int b = 0; b < per; ++b) c += static_cast<int>(hist[top - b]);
    int incl = c;
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    for (int w = 0; w < warp; ++w) incl += warp_tot[w];
    if (incl - c < remaining && incl >= remaining) {  // exactly one thread
        int cum = incl - c;
        for (int b = 0; b < per; ++b) {
            const int h = static_cast<int>(hist[top - b]);
            if (cum + h >= remaining) {
                *bin = top - b;
                *rem = remaining - cum;
                break;
            }
            cum += h;
        }
    }
    __syncthreads();
}

// One block per query of the chunk; dynamic shared memory: cache_n uint32 order keys.
__global__ void __launch_bounds__(kTopkThreads, 3)
    topk_kernel(const float* scores, const int64_t* pos, int64_t n_entries, int ratio,
                int64_t top_k, int cache_n, int32_t* idx) {
    extern __shared__ uint32_t cache[];  // order keys of entries 0 … cache_n − 1
    __shared__ unsigned hist[kBins];
    __shared__ int warp_a[kTopkWarps], warp_b[kTopkWarps];
    __shared__ int bin_s, rem_s;
    const int64_t t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = static_cast<int>(n_eligible(pos[t], ratio, n_entries));
    const float* s = scores + t * n_entries;
    int32_t* out = idx + t * top_k;
    if (n <= top_k) {  // everything eligible is selected
        for (int64_t i = tid; i < top_k; i += kTopkThreads)
            out[i] = i < n ? static_cast<int32_t>(i) : -1;
        return;
    }
    const int n_cached = n < cache_n ? n : cache_n;

    // Pass 1 (bits 31–21) reads the scores and fills the cache.
    for (int i = tid; i < kBins; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kTopkThreads) {
        const uint32_t u = order_key(s[i]);
        if (i < n_cached) cache[i] = u;
        atomicAdd(&hist[u >> 21], 1u);
    }
    __syncthreads();
    find_bin(hist, kBins, static_cast<int>(top_k), warp_a, &bin_s, &rem_s);
    uint32_t prefix = static_cast<uint32_t>(bin_s) << 21;
    int remaining = rem_s;  // how many of the keys matching `prefix` still to take
    // Passes 2 (bits 20–10) and 3 (bits 9–0) over the keys that match the prefix so far.
    for (int shift = 10; shift >= 0; shift -= 10) {
        const int bits = shift ? 11 : 10, high = shift + bits;
        for (int i = tid; i < kBins; i += kTopkThreads) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += kTopkThreads) {
            const uint32_t u = key_at(cache, n_cached, s, i);
            if ((u >> high) == (prefix >> high))
                atomicAdd(&hist[(u >> shift) & ((1u << bits) - 1u)], 1u);
        }
        __syncthreads();
        find_bin(hist, 1 << bits, remaining, warp_a, &bin_s, &rem_s);
        prefix |= static_cast<uint32_t>(bin_s) << shift;
        remaining = rem_s;
    }

    // prefix is the k-th largest key: take all larger ones and the first `remaining` equal ones.
    // Warp w scans entries [w·seg, (w + 1)·seg): counts first, then writes at its offset.
    const int seg = (n + kTopkThreads - 1) / kTopkThreads * 32;
    const int b0 = min(warp * seg, n), b1 = min(b0 + seg, n);
    const unsigned lt = (1u << lane) - 1u;
    int gt = 0, eq = 0;
    for (int i0 = b0; i0 < b1; i0 += 32) {
        const int i = i0 + lane;
        const uint32_t u = i < b1 ? key_at(cache, n_cached, s, i) : 0u;
        gt += __popc(__ballot_sync(0xffffffffu, i < b1 && u > prefix));
        eq += __popc(__ballot_sync(0xffffffffu, i < b1 && u == prefix));
    }
    if (lane == 0) {
        warp_a[warp] = gt;
        warp_b[warp] = eq;
    }
    __syncthreads();
    int gt_before = 0, eq_seen = 0;
    for (int w = 0; w < warp; ++w) {
        gt_before += warp_a[w];
        eq_seen += warp_b[w];
    }
    int at = gt_before + min(eq_seen, remaining);
    for (int i0 = b0; i0 < b1; i0 += 32) {
        const int i = i0 + lane;
        const uint32_t u = i < b1 ? key_at(cache, n_cached, s, i) : 0u;
        const bool is_eq = i < b1 && u == prefix;
        const unsigned eq_bits = __ballot_sync(0xffffffffu, is_eq);
        const bool sel =
            (i < b1 && u > prefix) || (is_eq && eq_seen + __popc(eq_bits & lt) < remaining);
        const unsigned sel_bits = __ballot_sync(0xffffffffu, sel);
        if (sel) out[at + __popc(sel_bits & lt)] = i;
        at += __popc(sel_bits);
        eq_seen += __popc(eq_bits);
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The Fp8 scratch, in bytes from its start, each part 1024-byte aligned: the chunk's scores
// [rows, n_entries] fp32, its queries q8 [rows, 64, 128] and folded weights [rows, 64], the keys
// k8 [n_entries, 128] and their factors [n_entries].
struct Fp8Layout {
    int64_t q8 = 0, wq = 0, k8 = 0, kf = 0, end = 0;
};

int64_t align1024(int64_t b) { return (b + 1023) / 1024 * 1024; }

Fp8Layout fp8_layout(int64_t n_entries, int64_t rows) {
    namespace f8 = indexer_hopper;
    Fp8Layout l;
    l.q8 = align1024(rows * n_entries * 4);
    l.wq = align1024(l.q8 + rows * f8::kPadHeads * f8::kRowBytes);
    l.k8 = align1024(l.wq + rows * f8::kPadHeads * 4);
    l.kf = align1024(l.k8 + n_entries * f8::kRowBytes);
    l.end = l.kf + n_entries * 4;
    return l;
}

// Rows of an Fp8 chunk that `bytes` of scratch holds (0 when not even one): the largest with
// fp8_layout(n_entries, rows).end ≤ bytes, by bisection (end grows with rows; the alignment makes
// an estimate per row come out a row short at times).
int64_t fp8_rows_fitting(int64_t n_entries, int64_t bytes) {
    if (fp8_layout(n_entries, 1).end > bytes) return 0;
    int64_t lo = 1, hi = bytes / (n_entries * 4) + 1;  // end(lo) ≤ bytes < end(hi)
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fp8_layout(n_entries, mid).end <= bytes ? lo : hi) = mid;
    }
    return lo;
}

}  // namespace

int64_t indexer_scratch_floats(IndexerPrecision precision, int64_t n_entries, int64_t rows) {
    const int64_t n_ent = std::max<int64_t>(n_entries, 1), r = std::max<int64_t>(rows, 1);
    if (precision == IndexerPrecision::Bf16) return r * n_ent;
    return (fp8_layout(n_ent, r).end + 3) / 4;
}

void indexer_topk(const IndexerArgs& a, float* scores, int64_t scores_floats, cudaStream_t stream) {
    if (a.n_q == 0) return;
    CPFILL_CHECK(a.n_heads >= 1 && a.n_heads <= kMaxHeads,
                 "indexer on CUDA: {} heads (1 to {} supported)", a.n_heads, kMaxHeads);
    CPFILL_CHECK(a.dim >= 16 && a.dim <= kMaxDim && a.dim % 16 == 0,
                 "indexer on CUDA: head dim {} (a multiple of 16 up to {})", a.dim, kMaxDim);
    CPFILL_CHECK(a.ratio >= 1 && a.top_k >= 1, "indexer: ratio {} and top_k {} must be ≥ 1",
                 a.ratio, a.top_k);
    CPFILL_CHECK(a.n_entries < (int64_t{1} << 31) && a.top_k < (int64_t{1} << 31),
                 "indexer: {} entries / top_k {} exceed int32 indices", a.n_entries, a.top_k);
    CPFILL_CHECK(aligned16(a.q) && aligned16(a.keys),
                 "indexer on CUDA: q and keys must be 16-byte aligned");
    const int64_t n_ent = std::max<int64_t>(a.n_entries, 1);
    const bool fp8 = a.precision == IndexerPrecision::Fp8;
    CPFILL_CHECK(fp8 || a.precision == IndexerPrecision::Bf16,
                 "indexer on CUDA: precision {} is neither bf16 nor fp8",
                 static_cast<int>(a.precision));
    CPFILL_CHECK(!fp8 || indexer_hopper::supported(),
                 "the fp8 indexer needs a GPU of compute capability 9.0 (Hopper); use the bf16 "
                 "indexer on this GPU");
    const bool hopper = !fp8 && !a.mma_sync && indexer_hopper::supported();
    const int64_t need = indexer_scratch_floats(a.precision, n_ent, 1);
    CPFILL_CHECK(scores_floats >= need, "indexer: scores scratch of {} floats, need ≥ {}",
                 scores_floats, need);
    const int64_t fit = fp8 ? fp8_rows_fitting(n_ent, scores_floats * 4) : scores_floats / n_ent;
    const int64_t chunk = std::min<int64_t>({fit, a.n_q, int64_t{1} << 30});
    const Fp8Layout lay = fp8 ? fp8_layout(n_ent, chunk) : Fp8Layout{};
    uint8_t* const raw = reinterpret_cast<uint8_t*>(scores);
    uint8_t* const q8 = raw + lay.q8;
    float* const wq = reinterpret_cast<float*>(raw + lay.wq);
    uint8_t* const k8 = raw + lay.k8;
    float* const kf = reinterpret_cast<float*>(raw + lay.kf);
    if (fp8)  // the keys once (their factor carries the scale dim^−½), then each chunk's queries
        indexer_hopper::quantize_rows(a.keys, a.dim, 1, 1, a.n_entries, nullptr, a.scale, k8, kf,
                                      stream);
    const int64_t n_splits = (a.n_entries + kSplit - 1) / kSplit;
    const int64_t groups = (chunk + kQueries - 1) / kQueries;
    CPFILL_CHECK(groups * n_splits <= 0x7fffffff,
                 "indexer: {} query groups × {} entry splits exceed one grid", groups, n_splits);
    const int score_smem = static_cast<int>(sizeof(ScoreSmem));
    const int cache_n = static_cast<int>(std::min<int64_t>(n_ent, kTopkCache));
    const int topk_smem = cache_n * static_cast<int>(sizeof(uint32_t));
    if (!fp8 && !hopper)  // the mma.sync kernel's shared memory, only where it runs
        CPFILL_CUDA_CHECK(cudaFuncSetAttribute(
            score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, score_smem));
    CPFILL_CUDA_CHECK(
        cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, topk_smem));
    for (int64_t t0 = 0; t0 < a.n_q; t0 += chunk) {
        const int64_t rows = std::min(chunk, a.n_q - t0);
        if (fp8 && a.n_entries > 0) {
            indexer_hopper::quantize_rows(
                a.q + t0 * a.n_heads * a.dim, a.dim, a.n_heads, indexer_hopper::kPadHeads,
                rows * indexer_hopper::kPadHeads, a.weight + t0 * a.n_heads, 1.0f, q8, wq, stream);
            indexer_hopper::score_fp8(q8, wq, a.pos + t0, rows, k8, kf, a.n_entries, a.ratio,
                                      scores, stream);
        } else if (hopper) {
            indexer_hopper::score_bf16(a.q + t0 * a.n_heads * a.dim, a.weight + t0 * a.n_heads,
                                       a.n_heads, a.dim, a.pos + t0, rows, a.keys, a.scale,
                                       a.n_entries, a.ratio, scores, stream);
        } else if (n_splits > 0) {
            const int64_t blocks = (rows + kQueries - 1) / kQueries * n_splits;
            score_kernel<<<static_cast<unsigned>(blocks), kScoreThreads, score_smem, stream>>>(
                a.q + t0 * a.n_heads * a.dim, a.weight + t0 * a.n_heads, a.pos + t0, rows,
                a.n_heads, a.dim, a.keys, a.n_entries, a.ratio, a.scale, static_cast<int>(n_splits),
                scores);
            CPFILL_CUDA_CHECK(cudaGetLastError());
        }
        topk_kernel<<<static_cast<unsigned>(rows), kTopkThreads, topk_smem, stream>>>(
            scores, a.pos + t0, n_ent, a.ratio, a.top_k, cache_n, a.idx + t0 * a.top_k);
        CPFILL_CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace cpfill::ops::cuda
