// The indexer's scoring on Hopper (ops/cuda/indexer_hopper.h): a quantising kernel for the fp8
// rows and one scoring kernel, a template over the operand type.
//
// quantize_rows_kernel: one warp per output row of 128 e4m3, lane l the channels 4l … 4l + 3 (zero
// past the input's dim, or the whole row for a pad head); scale s = amax / 448 (1 when all are 0),
// each value v / s rounded by cvt.rn.satfinite.e4m3x2 — ops::round_fp8_blocks on the CPU. The
// row's factor out = s · (its head weight, or a constant) folds the scale into what multiplies
// the row's dot products later; a pad row gets 0.
//
// score_kernel<kBf16, kUsed>: a block of three warpgroups owns 8 queries and up to kSplit entries.
// The first warpgroup's thread 0 loads (TMA, 128-byte swizzle) the 8 queries' 512 head rows once
// (64 heads; the map pads missing heads and dims with zeros), then streams key tiles of 128 entries
// into a ring of stages. A row is 128 bytes of e4m3, or two halves of 64 bf16 channels kept as two
// tiles of 128-byte rows (one when dim ≤ 64). Each of the other two warpgroups scores 64 keys of a
// tile against the 8 queries, two queries at a time: wgmma (A: its 64 keys, B: the two queries'
// 128 head rows, both from shared memory; four m64n128k32 e4m3 or four m64n128k16 bf16 per half)
// give S[64 keys, 2 × 64 heads] in fp32, double-buffered so that the next pair's MMAs run while
// this pair's epilogue computes Σ_h w_h · ReLU(S[key, h]) (16 heads in a thread, then across the
// quad) and writes score = key factor · that sum. Products of e4m3 or bf16 values are exact in
// fp32; only the order of the sums differs from the CPU.
#include "core/error.h"
#include "ops/cuda/fp8_device.cuh"
#include "ops/cuda/indexer_device.cuh"
#include "ops/cuda/indexer_hopper.h"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/sm90.h"

namespace cpfill::ops::cuda::indexer_hopper {

namespace {

constexpr int kHeads = kPadHeads, kDim = kRowBytes;
constexpr int kQ = 8;                // queries per block
constexpr int kQRows = kQ * kHeads;  // their head rows (per half of a bf16 row)
constexpr int kQBoxQueries = 4;      // queries per TMA box of head rows (32 KB)
constexpr int kKeys = 128;           // entries per stage (two warpgroups × 64)
// Entries per block (a multiple of kKeys): a block's fixed work (the queries' rows, the first
// key tile, the last tile's epilogue, with one block per multiprocessor nothing beside it) costs
// a few tiles' time, so long splits pay: at 64k, 4,096 → 16,384 took the fp8 kernel from 783 to
// 857 TFLOP/s and bf16 from 550 to 572 (session 29, run 6).
constexpr int kSplit = 16384;
constexpr int kThreads = 384;  // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kPairRowBytes = 2 * kHeads * kDim;  // B of one MMA: two queries' head rows

// Rows of bf16 are two 128-byte halves; fewer stages then fit beside the queries.
template <bool kBf16>
struct Cfg {
    static constexpr int kHalves = kBf16 ? 2 : 1;
    static constexpr int kStages = kBf16 ? 2 : 4;  // key tiles in flight
};

template <bool kBf16>
struct Smem {
    static constexpr int kHalves = Cfg<kBf16>::kHalves, kStages = Cfg<kBf16>::kStages;
    uint8_t q[kHalves][kQRows][kDim];  // 1024-byte aligned: the swizzle's atom
    uint8_t k[kStages][kHalves][kKeys][kDim];
    float w[kQ][kHeads];  // the queries' head weights (folded scales for fp8), zero past n_heads
    uint64_t qfull, full[kStages], empty[kStages];
    int n_own[kQ];  // eligible entries of each query (0 past the chunk)
};
template <bool kBf16>
constexpr size_t kSmemBytes = sizeof(Smem<kBf16>) + 1024;  // + alignment of the dynamic base
static_assert(kSmemBytes<false> <= 227 * 1024 && kSmemBytes<true> <= 227 * 1024,
              "more than the 227 KB of shared memory a block may have");

// Output row r: input row (r / heads_out) · heads_in + r % heads_out when r % heads_out <
// heads_in, else a pad row. factor_out[r] = s · (mult ? mult[input row] : factor), 0 for pads.
__global__ void quantize_rows_kernel(const __nv_bfloat16* x, int dim, int heads_in, int heads_out,
                                     int64_t n_out, const float* mult, float factor, uint8_t* q,
                                     float* factor_out) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= n_out) return;
    const int lane = threadIdx.x % 32, c = 4 * lane;
    const int64_t t = r / heads_out;
    const int h = static_cast<int>(r % heads_out);
    const bool real = h < heads_in;
    const int64_t in_row = t * heads_in + h;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (real && c < dim) {
        const uint2 raw = *reinterpret_cast<const uint2*>(x + in_row * dim + c);
        v[0] = __uint_as_float(raw.x << 16);
        v[1] = __uint_as_float(raw.x & 0xffff0000u);
        v[2] = __uint_as_float(raw.y << 16);
        v[3] = __uint_as_float(raw.y & 0xffff0000u);
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    amax = fp8_device::warp_max(amax);
    const float s = fp8_device::e4m3_scale(amax);
    const uint32_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(v[0] / s, v[1] / s), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v[2] / s, v[3] / s), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(q + r * kDim + c) = lo | hi << 16;
    if (lane == 0) factor_out[r] = real ? s * (mult ? mult[in_row] : factor) : 0.0f;
}

// d = keys (A, 64 rows at a, each half kKeys rows further) · the pair's head rows (B, 128 rows at
// b, each half kQRows rows further)ᵀ over kUsed halves of 128 bytes.
template <bool kBf16, int kUsed>
__device__ __forceinline__ void issue_pair(float (&d)[64], uint32_t a, uint32_t b) {
    reg_fence_all(d);
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < kUsed; ++h) {
        const uint32_t ah = a + h * kKeys * kDim, bh = b + h * kQRows * kDim;
#pragma unroll
        for (int k = 0; k < kDim / 32; ++k) {
            const uint64_t da = wgmma_desc_sw128(ah + k * 32), db = wgmma_desc_sw128(bh + k * 32);
            if constexpr (kBf16)
                wgmma_m64n128k16_bf16(d, da, db, h + k);
            else
                wgmma_m64n128k32_e4m3(d, da, db, k);
        }
    }
    wgmma_commit();
}

// Pair p's scores from d: thread (warp, g = lane / 4, c = lane % 4) holds keys r0 = 16·warp + g
// and r0 + 8, heads 8i + 2c (+1) of query 2p for i < 8 and of query 2p + 1 for i ≥ 8.
template <bool kBf16>
__device__ __forceinline__ void score_pair(const float (&d)[64], const Smem<kBf16>& s, int p, int c,
                                           int64_t key0, int64_t key1, float ks0, float ks1,
                                           float* out0, int64_t n_entries) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (query 2p, key0), (2p, key1), (2p + 1, key0), …
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const float2 w = *reinterpret_cast<const float2*>(&s.w[2 * p + i / 8][8 * (i % 8) + 2 * c]);
        float& lo = v[2 * (i / 8)];
        float& hi = v[2 * (i / 8) + 1];
        lo = fmaf(w.x, fmaxf(d[4 * i], 0.0f), fmaf(w.y, fmaxf(d[4 * i + 1], 0.0f), lo));
        hi = fmaf(w.x, fmaxf(d[4 * i + 2], 0.0f), fmaf(w.y, fmaxf(d[4 * i + 3], 0.0f), hi));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = quad_sum(v[j]);
    // Lane c writes value c: query 2p + c / 2, key c % 2 (16 consecutive floats per warp).
    const int ql = 2 * p + c / 2;
    const int64_t key = c & 1 ? key1 : key0;
    const float val = c == 0 ? v[0] : c == 1 ? v[1] : c == 2 ? v[2] : v[3];
    if (key < s.n_own[ql]) out0[ql * n_entries + key] = val * (c & 1 ? ks1 : ks0);
}

// grid: (query groups of kQ) × (entry splits of kSplit), split fastest; kUsed: the halves of a
// row that hold channels (a bf16 row of ≤ 64 channels has one). map_q: the queries' head
// rows [rows, heads, row bytes] in boxes of kQBoxQueries × 64 × 128 bytes; map_k: the keys
// [n_entries, row bytes] in boxes of kKeys × 128 bytes. wq [rows, n_w] head weights; a key's factor
// is kfactor[e], or kscale when kfactor is null.
template <bool kBf16, int kUsed>
__global__ void __launch_bounds__(kThreads, 1)
    score_kernel(const __grid_constant__ CUtensorMap map_q,
                 const __grid_constant__ CUtensorMap map_k, const float* wq, int n_w,
                 const float* kfactor, float kscale, const int64_t* pos, int64_t rows,
                 int64_t n_entries, int ratio, int n_splits, float* scores) {
    constexpr int kStages = Cfg<kBf16>::kStages;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* const base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    Smem<kBf16>& s = *reinterpret_cast<Smem<kBf16>*>(base);
    const int64_t t0 = static_cast<int64_t>(blockIdx.x / n_splits) * kQ;
    const int64_t e0 = static_cast<int64_t>(blockIdx.x % n_splits) * kSplit;
    int64_t n_blk = 0;
    for (int j = 0; j < kQ; ++j) {
        const int64_t n = t0 + j < rows ? n_eligible(pos[t0 + j], ratio, n_entries) : 0;
        n_blk = n > n_blk ? n : n_blk;
        if (j == threadIdx.x) s.n_own[j] = static_cast<int>(n);
    }
    if (e0 >= n_blk) return;  // the same for every thread
    const int64_t e1 = e0 + kSplit < n_blk ? e0 + kSplit : n_blk;
    const int n_tiles = static_cast<int>((e1 - e0 + kKeys - 1) / kKeys);
    for (int i = threadIdx.x; i < kQ * kHeads; i += kThreads) {
        const int64_t t = t0 + i / kHeads;
        const int h = i % kHeads;
        s.w[i / kHeads][h] = t < rows && h < n_w ? wq[t * n_w + h] : 0.0f;
    }
    if (threadIdx.x == 0) {
        mbar_init(&s.qfull, 1);
        for (int i = 0; i < kStages; ++i) {
            mbar_init(&s.full[i], 1);
            mbar_init(&s.empty[i], kConsumerWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (wg == 0) {
        setmaxnreg_dec40();
        if (tid != 0) return;
        tma_prefetch_map(&map_q);
        tma_prefetch_map(&map_k);
        // Boxes wholly past the last query are not loaded: their rows feed only the MMA columns
        // of queries with nothing eligible, whose scores are never written.
        constexpr int kBoxRows = kQBoxQueries * kHeads;
        const int64_t left = rows - t0;
        const int n_boxes = static_cast<int>(left >= kQ ? kQ / kQBoxQueries
                                                        : (left + kQBoxQueries - 1) / kQBoxQueries);
        mbar_arrive_expect_tx(&s.qfull, kUsed * n_boxes * kBoxRows * kDim);
        for (int h = 0; h < kUsed; ++h)
            for (int b = 0; b < n_boxes; ++b)
                tma_load_3d(s.q[h][b * kBoxRows], &map_q, &s.qfull, h * kDim, 0,
                            static_cast<int>(t0) + b * kQBoxQueries);
        for (int it = 0; it < n_tiles; ++it) {
            const int st = it % kStages;
            mbar_wait(&s.empty[st], ((it / kStages) & 1) ^ 1);
            mbar_arrive_expect_tx(&s.full[st], kUsed * kKeys * kDim);
            for (int h = 0; h < kUsed; ++h)
                tma_load_2d(s.k[st][h], &map_k, &s.full[st], h * kDim,
                            static_cast<int>(e0) + it * kKeys);
        }
        return;
    }
    setmaxnreg_inc232();
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32, c = lane % 4;
    float* const out0 = scores + t0 * n_entries;
    const uint32_t sq = smem_u32(s.q);
    mbar_wait(&s.qfull, 0);
    float d[2][64];
    for (int it = 0; it < n_tiles; ++it) {
        const int st = it % kStages;
        const int64_t kw = e0 + static_cast<int64_t>(it) * kKeys + cw * 64;  // this WG's first
        mbar_wait(&s.full[st], (it / kStages) & 1);
        if (kw < e1) {
            const int64_t key0 = kw + warp * 16 + lane / 4, key1 = key0 + 8;
            const float ks0 = key0 < n_entries ? (kfactor ? kfactor[key0] : kscale) : 0.0f;
            const float ks1 = key1 < n_entries ? (kfactor ? kfactor[key1] : kscale) : 0.0f;
            const uint32_t sa = smem_u32(s.k[st]) + cw * 64 * kDim;
            issue_pair<kBf16, kUsed>(d[0], sa, sq);
#pragma unroll
            for (int p = 0; p < kQ / 2; ++p) {
                if (p + 1 < kQ / 2) {
                    issue_pair<kBf16, kUsed>(d[(p + 1) & 1], sa, sq + (p + 1) * kPairRowBytes);
                    wgmma_wait<1>();
                } else {
                    wgmma_wait<0>();
                }
                reg_fence_all(d[p & 1]);
                score_pair<kBf16>(d[p & 1], s, p, c, key0, key1, ks0, ks1, out0, n_entries);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&s.empty[st]);
    }
}

// Launches score_kernel<kBf16, kUsed> over rows × n_entries.
template <bool kBf16, int kUsed>
void launch_score(const CUtensorMap& mq, const CUtensorMap& mk, const float* wq, int n_w,
                  const float* kfactor, float kscale, const int64_t* pos, int64_t rows,
                  int64_t n_entries, int ratio, float* scores, cudaStream_t stream) {
    const int64_t n_splits = (n_entries + kSplit - 1) / kSplit;
    const int64_t blocks = (rows + kQ - 1) / kQ * n_splits;
    CPFILL_CHECK(blocks <= 0x7fffffff, "indexer: {} query groups × {} splits exceed one grid",
                 (rows + kQ - 1) / kQ, n_splits);
    constexpr int smem = static_cast<int>(kSmemBytes<kBf16>);
    CPFILL_CUDA_CHECK(cudaFuncSetAttribute(score_kernel<kBf16, kUsed>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    score_kernel<kBf16, kUsed><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
        mq, mk, wq, n_w, kfactor, kscale, pos, rows, n_entries, ratio, static_cast<int>(n_splits),
        scores);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool supported() { return ::cpfill::cuda::current_device_is_sm90(); }

void quantize_rows(const __nv_bfloat16* x, int dim, int heads_in, int heads_out, int64_t n_out,
                   const float* mult, float factor, uint8_t* q, float* factor_out,
                   cudaStream_t stream) {
    if (n_out == 0) return;
    CPFILL_CHECK(dim >= 4 && dim <= kDim && dim % 4 == 0 && heads_in <= heads_out,
                 "fp8 indexer: rows of {} channels, {} of {} heads (expected ≤ {} channels, a "
                 "multiple of 4)",
                 dim, heads_in, heads_out, kDim);
    constexpr int kWarps = 8;
    const int64_t blocks = (n_out + kWarps - 1) / kWarps;
    CPFILL_CHECK(blocks <= 0x7fffffff, "fp8 indexer: {} rows exceed one grid", n_out);
    quantize_rows_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
        x, dim, heads_in, heads_out, n_out, mult, factor, q, factor_out);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void score_fp8(const uint8_t* q8, const float* wq, const int64_t* pos, int64_t rows,
               const uint8_t* k8, const float* kfactor, int64_t n_entries, int ratio, float* scores,
               cudaStream_t stream) {
    if (rows == 0 || n_entries == 0) return;
    CPFILL_CHECK(rows * kHeads < (int64_t{1} << 31) && n_entries < (int64_t{1} << 31),
                 "fp8 indexer: {} queries × {} entries out of range", rows, n_entries);
    const CUtensorMap mq =
        byte_tile_map_3d(q8, kDim, kHeads, rows, kHeads, kQBoxQueries, "fp8 indexer queries");
    const CUtensorMap mk = e4m3_tile_map(k8, n_entries, kDim, kKeys, "fp8 indexer keys");
    launch_score<false, 1>(mq, mk, wq, kHeads, kfactor, 0.0f, pos, rows, n_entries, ratio, scores,
                           stream);
}

void score_bf16(const __nv_bfloat16* q, const float* weight, int n_heads, int dim,
                const int64_t* pos, int64_t rows, const __nv_bfloat16* keys, float scale,
                int64_t n_entries, int ratio, float* scores, cudaStream_t stream) {
    if (rows == 0 || n_entries == 0) return;
    CPFILL_CHECK(n_heads >= 1 && n_heads <= kHeads && dim >= 8 && dim <= kDim && dim % 8 == 0,
                 "bf16 indexer: {} heads × {} dims (expected ≤ {} heads, ≤ {} dims in steps of 8)",
                 n_heads, dim, kHeads, kDim);
    CPFILL_CHECK(rows < (int64_t{1} << 31) && n_entries < (int64_t{1} << 31),
                 "bf16 indexer: {} queries × {} entries out of range", rows, n_entries);
    const int64_t row_bytes = int64_t{dim} * 2;
    const CUtensorMap mq =
        byte_tile_map_3d(q, row_bytes, n_heads, rows, kHeads, kQBoxQueries, "bf16 indexer queries");
    const CUtensorMap mk = e4m3_tile_map(keys, n_entries, row_bytes, kKeys, "bf16 indexer keys");
    if (row_bytes > kDim)
        launch_score<true, 2>(mq, mk, weight, n_heads, nullptr, scale, pos, rows, n_entries, ratio,
                              scores, stream);
    else
        launch_score<true, 1>(mq, mk, weight, n_heads, nullptr, scale, pos, rows, n_entries, ratio,
                              scores, stream);
}

}  // namespace cpfill::ops::cuda::indexer_hopper
