// grouped_gemm_fp8: one persistent launch for all experts. A block is three warpgroups: the first
// loads (one thread issues TMA copies of 128 rows of x and 256 rows of w, 128 bytes of K each,
// into a ring of kStages shared-memory stages, each completing on its `full` mbarrier), the other
// two compute 64 rows each of a 128 × 256 output tile with wgmma. Per 128-wide k-block and
// 128-output half a consumer accumulates the raw e4m3 products in one register tile, then adds it
// to that half's accumulators times the block's scales (row scale of x × tile scale of w),
// DeepSeek's promotion of fp8 partial sums to fp32, and frees the stage (`empty`). 256 outputs
// per tile read 1.33× fewer bytes from L2 per FLOP than 128; measured, that changed the rate by
// 1% (the kernel is not L2-bound; docs/fp8.md has where its time goes). Tiles are numbered expert
// by expert, row tile by row tile, output tile fastest, and dealt round-robin to the blocks: the
// blocks working at one time share an expert's weights and a row tile's activations in L2.
//
// Two epilogues (GroupedFp8Epilogue, a template parameter; the same bf16 of the same fp32 sums):
// * Registers, 4 stages of 48 KB: each thread stores its bf16 pairs straight to global memory.
// * TmaStore, 3 stages of 48 KB + a 32 KB output tile per consumer (1024-byte aligned, after the
//   barriers and tile_first): 64 rows × 256 outputs as four 64-output chunks of 64 rows × 128
//   bytes in the 128-byte swizzle (16-byte unit u of row r at u ^ (r % 8): the stmatrix writes
//   of a warp hit every bank once). Per tile a consumer (named barrier 1 + consumer, 128 threads)
//   waits until its thread 0's stores of the previous tile have read the buffer, writes the
//   tile, fences it to the async proxy, syncs, and thread 0 issues bulk tensor stores of the rows
//   inside the expert's padded block and commits them as one bulk group, which runs on while the
//   next tile computes. Boxes are 64 outputs wide: 64 rows when all the consumer's rows are in
//   the expert, else 8-row boxes and one 4-row box at the end (padded blocks are multiples of 4
//   rows, so no box crosses into the next expert; every box starts on a 1024-byte swizzle atom).
//
// grouped_gemm_bf16: the same kernel with bf16 operands (template parameter kBf16). A k-block is 64
// values, still 128 bytes, so the TMA boxes, stages and descriptors are the fp8 path's; there are
// no scales, so each consumer keeps its 64 × 256 accumulators over all of K (wgmma m64n256k16: A
// read once per k16 step) and frees a stage once the next k-block's MMAs are issued and its own
// have completed (wait_group 1). Rows are dense (gather_by_expert), so only the register epilogue.
// Its tall tiles (kTall, GroupedBf16Tile::Tall): 256 rows × 128 outputs per block, each consumer
// two 64 × 128 parts (rows 64·cw … and 128 + 64·cw …) sharing the B descriptor, so that an expert
// of up to 256 rows reads its weights once; a part (or, in wide tiles, a consumer) with no rows of
// the expert issues no MMAs.
#include "core/error.h"
#include "ops/cuda/grouped_fp8.h"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/sm90.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 128, kThreads = 384;
constexpr int kBBytes = kBN * kBK, kHalfBytes = kBBytes / 2;
constexpr int kMaxExperts = 1024;
constexpr int kConsumerWarps = 8;
// TmaStore's output tile of one consumer: 64 rows × 256 bf16 as 4 chunks of 64 rows × 128 bytes.
constexpr int kYRows = 64, kYChunkCols = 64, kYRowBytes = kYChunkCols * 2;
constexpr int kYChunkBytes = kYRows * kYRowBytes, kYTileBytes = kBN / kYChunkCols * kYChunkBytes;
constexpr int kYBox = 64, kYBoxMid = 8, kYBoxTail = 4;  // rows of the three output boxes

using Epilogue = GroupedFp8Epilogue;

template <Epilogue kEpi>
constexpr int kStagesOf = kEpi == Epilogue::Registers ? 4 : 3;

// The output tile of one block: kBM × kBN (wide, every path) or, for bf16 experts with few rows
// each, 256 rows × 128 outputs (tall).
template <bool kTall>
struct TileShape {
    static constexpr int m = kTall ? 2 * kBM : kBM, n = kTall ? kBN / 2 : kBN;
};

template <int kStages, bool kTall = false>
struct Smem {
    // Each stage 1024-byte aligned (the swizzle's atom); a stage is 48 KB either way.
    uint8_t a[kStages][TileShape<kTall>::m * kBK];
    uint8_t b[kStages][TileShape<kTall>::n * kBK];
    uint64_t full[kStages], empty[kStages];
    int32_t tile_first[kMaxExperts + 1];  // the first tile of each expert; [E]: all tiles
};
// TmaStore's two output tiles start at the first 1024-byte boundary after Smem.
template <int kStages>
constexpr size_t kYOffset = (sizeof(Smem<kStages>) + 1023) / 1024 * 1024;
template <Epilogue kEpi>
constexpr size_t kSmemBytes =  // + alignment of the dynamic base
    (kEpi == Epilogue::Registers ? sizeof(Smem<kStagesOf<kEpi>>)
                                 : kYOffset<kStagesOf<kEpi>> + 2 * kYTileBytes) +
    1024;
static_assert(sizeof(Smem<4, true>) == sizeof(Smem<4>) && sizeof(Smem<3, true>) == sizeof(Smem<3>),
              "tall tiles use the wide ones' space");
static_assert(kSmemBytes<Epilogue::Registers> <= 227 * 1024 &&
                  kSmemBytes<Epilogue::TmaStore> <= 227 * 1024,
              "more than the 227 KB of shared memory a block may have");

// The output boxes of TmaStore (bf16 [n_pad, out], 64 outputs × 64, 8 or 4 rows, 128-byte swizzle).
struct OutMaps {
    CUtensorMap rows64, rows8, rows4;
};

struct Args {
    const float* xs;
    const int32_t* pfirst;
    int n_experts;
    const float* ws;
    int64_t ws_per_expert;
    const float* ws_last;  // set: the last expert's scales (GroupedFp8Gemm::w_last)
    int in, out;
    __nv_bfloat16* y;
};

struct Tile {
    int e, mt, nt;
};

__device__ Tile tile_of(const int32_t* tile_first, int E, int n_tiles_n, int t) {
    int lo = 0, hi = E - 1;  // the largest e with tile_first[e] ≤ t: empty experts share their
    while (lo < hi) {        // successor's first tile, so it is the non-empty one
        const int mid = (lo + hi + 1) / 2;
        if (tile_first[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int local = t - tile_first[lo];
    return {lo, local / n_tiles_n, local % n_tiles_n};
}

// Warp 0: tile_first from pfirst (ceil(m4_e / kRows) row tiles of n_tiles_n output tiles each).
template <int kRows>
__device__ void count_tiles(int32_t* tile_first, const int32_t* pfirst, int E, int n_tiles_n) {
    const int lane = threadIdx.x % 32, per = (E + 31) / 32;
    const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
    int sum = 0;
    for (int e = e0; e < e1; ++e)
        sum += (pfirst[e + 1] - pfirst[e] + kRows - 1) / kRows * n_tiles_n;
    int incl = sum;
    for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    int run = incl - sum;
    for (int e = e0; e < e1; ++e) {
        tile_first[e] = run;
        run += (pfirst[e + 1] - pfirst[e] + kRows - 1) / kRows * n_tiles_n;
    }
    if (lane == 31) tile_first[E] = incl;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // as the register epilogue rounds
    return *reinterpret_cast<const uint32_t*>(&v);
}

// TmaStore's epilogue of one consumer, all 128 of its threads (the file comment has the layout).
// y: the consumer's output tile in shared memory; grow: the global row of its first row; v: its
// rows inside the expert's padded block (a multiple of 4, ≤ 0 when none); c0: the tile's first
// output.
__device__ __forceinline__ void store_tile_tma(const float (&acc)[2][64], bool second, uint32_t y,
                                               int cw, int tid, const OutMaps& maps, int grow,
                                               int v, int c0) {
    const int warp = tid / 32, lane = tid % 32;
    if (tid == 0) bulk_wait_read<0>();  // the previous tile's stores have read y
    named_barrier_sync(1 + cw, 128);
    __syncwarp();  // stmatrix is .aligned: the warp converged
    // stmatrix p of half h: matrices (rows +0, units 2p), (+8, 2p), (+0, 2p + 1), (+8, 2p + 1) of
    // the warp's 16 rows, 16-byte unit u of the 32 in a row = 8 outputs. Lane l gives row
    // l % 8 (+8 for (l / 8) odd) of matrix l / 8; the swizzle XORs its unit with row % 8 = l % 8.
    const int row = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
    const uint32_t row_addr = y + row * kYRowBytes, key = (lane / 16) ^ (lane % 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (h == 1 && !second) break;
#pragma unroll
        for (int p = 0; p < 8; ++p) {
            const uint32_t chunk = 2 * h + p / 4, u = (2 * p) % 8;
            stmatrix_x4(row_addr + chunk * kYChunkBytes + ((u ^ key) << 4),
                        pack_bf16x2(acc[h][8 * p], acc[h][8 * p + 1]),
                        pack_bf16x2(acc[h][8 * p + 2], acc[h][8 * p + 3]),
                        pack_bf16x2(acc[h][8 * p + 4], acc[h][8 * p + 5]),
                        pack_bf16x2(acc[h][8 * p + 6], acc[h][8 * p + 7]));
        }
    }
    fence_proxy_async_shared();  // each writer's stores, before TMA reads them
    named_barrier_sync(1 + cw, 128);
    // Boxes of 64 outputs: 64 rows, or 8-row boxes and a last 4-row one (v - r is 0 or 4 after the
    // loop), each starting on a row that is a multiple of 8: a 1024-byte swizzle atom.
    if (tid != 0 || v <= 0) return;
#pragma unroll 1
    for (int q = 0; q < (second ? 4 : 2); ++q) {
        const uint32_t src = y + q * kYChunkBytes;
        const int col = c0 + q * kYChunkCols;
        if (v == kYRows) {
            tma_store_2d(&maps.rows64, src, col, grow);
            continue;
        }
        int r = 0;
        for (; r + kYBoxMid <= v; r += kYBoxMid)
            tma_store_2d(&maps.rows8, src + r * kYRowBytes, col, grow + r);
        if (r < v) tma_store_2d(&maps.rows4, src + r * kYRowBytes, col, grow + r);
    }
    bulk_commit();
}

// The end of a bf16 tile's main loop: its MMAs complete, the accumulators fenced against them,
// and the stage of its last k-block freed (the others were freed in the loop, one k-block late).
template <int kStages, bool kTall>
__device__ __forceinline__ void finish_bf16_tile(Smem<kStages, kTall>& s, float (&acc)[2][64],
                                                 int it, int lane) {
    wgmma_wait<0>();
    reg_fence_all(acc);
    __syncwarp();
    if (lane == 0) mbar_arrive(&s.empty[(it - 1) % kStages]);
}

// The main loop of one tall bf16 tile (grouped_gemm_bf16 with kTall: no scales, so every
// k-block's products go straight into the accumulators, and the MMAs of a k-block run on while the
// next stage is awaited; a stage is freed once the MMAs after it have been issued and its own have
// completed, wait_group 1). kParts of the consumer's two 64 × 128 parts are multiplied (per k16
// step one MMA per part, B read by both): 0 (no rows of the expert here: each stage is freed once
// it is full), 1 or 2. The case is a template parameter, chosen once per tile, so that no wgmma is
// issued on a path ptxas sees as divergent: with the parts tested inside the k-loop (before
// session 41) ptxas serialised every wgmma (its warning C7520, "wgmma.mma_async instructions are
// serialized due to ... compiler-inserted WG.AR in divergent path": a wait after each MMA), and
// the tall tiles ran 10–13% slower at 192 rows per expert (docs/performance-notes.md, session 41).
// a0 / a1: the byte offset of each part's first row in a stage's A tile.
template <int kStages, int kParts>
__device__ __forceinline__ void tall_bf16_mainloop(Smem<kStages, true>& s, float (&acc)[2][64],
                                                   int n_kb, int& it, int lane, uint32_t a0,
                                                   uint32_t a1) {
    for (int kb = 0; kb < n_kb; ++kb, ++it) {
        const int st = it % kStages;
        mbar_wait(&s.full[st], (it / kStages) & 1);
        if constexpr (kParts == 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&s.empty[st]);
        } else {
            const uint32_t sa = smem_u32(s.a[st]), sbm = smem_u32(s.b[st]);
            // Written out, not reg_fence_all(acc): through the helper nvcc 13 no longer peels
            // this k-loop's first k-block (12 wgmma instructions in the PTX instead of 20), a
            // change of the measured code that no GPU has timed.
#pragma unroll
            for (int j = 0; j < 64; ++j) {
                reg_fence(acc[0][j]);
                reg_fence(acc[1][j]);
            }
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k) {
                const uint64_t b = wgmma_desc_sw128(sbm + k * 32);
                wgmma_m64n128k16_bf16(acc[0], wgmma_desc_sw128(sa + a0 + k * 32), b, 1);
                if constexpr (kParts == 2)
                    wgmma_m64n128k16_bf16(acc[1], wgmma_desc_sw128(sa + a1 + k * 32), b, 1);
            }
            wgmma_commit();
            if (kb > 0) {
                wgmma_wait<1>();
                __syncwarp();
                if (lane == 0) mbar_arrive(&s.empty[(it - 1) % kStages]);
            }
        }
    }
    if constexpr (kParts > 0) finish_bf16_tile(s, acc, it, lane);
}

// kBf16: bf16 operands (grouped_gemm_bf16), a k-block is 64 values; else e4m3 with scales.
// kTall (bf16 only): 256 × 128 tiles (TileShape).
template <Epilogue kEpi, bool kBf16, bool kTall = false>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_kernel(const __grid_constant__ CUtensorMap map_x,
                   const __grid_constant__ CUtensorMap map_w,
                   const __grid_constant__ CUtensorMap map_w_last,
                   const __grid_constant__ OutMaps map_y, const Args a) {
    static_assert(kBf16 || !kTall, "tall tiles are for bf16 operands");
    constexpr int kStages = kStagesOf<kEpi>;
    constexpr int BM = TileShape<kTall>::m, BN = TileShape<kTall>::n;
    constexpr int kABytesT = BM * kBK, kBBytesT = BN * kBK;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* const base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    Smem<kStages, kTall>& s = *reinterpret_cast<Smem<kStages, kTall>*>(base);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int E = a.n_experts, n_tiles_n = (a.out + BN - 1) / BN;
    const int n_kb = a.in * (kBf16 ? 2 : 1) / kBK;  // k-blocks of 128 bytes
    if (threadIdx.x < 32) count_tiles<BM>(s.tile_first, a.pfirst, E, n_tiles_n);
    if (threadIdx.x == 32) {
        for (int i = 0; i < kStages; ++i) {
            mbar_init(&s.full[i], 1);
            mbar_init(&s.empty[i], kConsumerWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int n_tiles = s.tile_first[E];
    if (wg == 0) {
        setmaxnreg_dec40();
        if (tid != 0) return;
        tma_prefetch_map(&map_x);
        tma_prefetch_map(&map_w);
        if (a.ws_last) tma_prefetch_map(&map_w_last);
        int it = 0;
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
            const Tile tl = tile_of(s.tile_first, E, n_tiles_n, t);
            const bool last = a.ws_last && tl.e == E - 1;  // the expert held apart
            const int row0 = a.pfirst[tl.e] + tl.mt * BM;
            const int wrow0 = (last ? 0 : tl.e * a.out) + tl.nt * BN;
            const CUtensorMap* mw = last ? &map_w_last : &map_w;
            for (int kb = 0; kb < n_kb; ++kb, ++it) {
                const int st = it % kStages;
                mbar_wait(&s.empty[st], ((it / kStages) & 1) ^ 1);
                mbar_arrive_expect_tx(&s.full[st], kABytesT + kBBytesT);
                tma_load_2d(s.a[st], &map_x, &s.full[st], kb * kBK, row0);
                tma_load_2d(s.b[st], mw, &s.full[st], kb * kBK, wrow0);
            }
        }
        return;
    }
    setmaxnreg_inc232();
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
    const int ws_ld = (n_kb + 3) / 4 * 4;  // Tile128 scales: [out/128][round_up(in/128, 4)]
    int it = 0;  // k-blocks consumed by this block so far (the ring's position)
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const Tile tl = tile_of(s.tile_first, E, n_tiles_n, t);
        const int p0 = a.pfirst[tl.e], m4 = a.pfirst[tl.e + 1] - p0;
        // The accumulators' two parts h (64 rows × 128 outputs each): wide tiles, the consumer's
        // 64 rows × outputs 128 h …; tall, rows 64 (2h + cw) … (interleaved, so that an expert of
        // 65–128 rows in its last tile keeps both consumers busy) × all 128 outputs.
        const auto part_row = [&](int h) { return kTall ? 64 * (2 * h + cw) : 64 * cw; };
        const int r0 = tl.mt * BM + cw * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
        const int c0 = tl.nt * BN;
        // Wide: the tile's second 128 outputs exist. Tall: the second part's rows are the
        // expert's. A part without rows (or a consumer: `active`) issues no MMAs.
        const bool second = kTall ? tl.mt * BM + part_row(1) < m4 : c0 + kBN / 2 < a.out;
        const bool active = tl.mt * BM + part_row(0) < m4;
        float acc[2][64];
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[0][j] = acc[1][j] = 0.0f;
        if constexpr (kBf16 && kTall) {
            const uint32_t a0 = part_row(0) * kBK, a1 = part_row(1) * kBK;
            if (active && second)
                tall_bf16_mainloop<kStages, 2>(s, acc, n_kb, it, lane, a0, a1);
            else if (active)
                tall_bf16_mainloop<kStages, 1>(s, acc, n_kb, it, lane, a0, a1);
            else
                tall_bf16_mainloop<kStages, 0>(s, acc, n_kb, it, lane, a0, a1);
        } else if constexpr (kBf16) {
            // Wide bf16 tiles, the same pipeline with the MMAs' case tested inside the k-loop.
            // ptxas serialises these wgmmas (warning C7520, as it did the tall ones), and here
            // that is measured faster: the case hoisted as in tall_bf16_mainloop (no warning, the
            // MMAs pipelined) ran 1.5–1.9× slower at 1,536 rows per expert, the same at 192
            // (docs/performance-notes.md, session 41; not understood).
            for (int kb = 0; kb < n_kb; ++kb, ++it) {
                const int st = it % kStages;
                mbar_wait(&s.full[st], (it / kStages) & 1);
                const uint32_t sa = smem_u32(s.a[st]) + part_row(0) * kBK, sbm = smem_u32(s.b[st]);
                reg_fence_all(acc);
                wgmma_fence();
                if (!active) {
                    // no rows of the expert here: nothing to multiply
                } else if (second) {  // both halves in one MMA per k16 step: A read once
                    float(&both)[128] = reinterpret_cast<float(&)[128]>(acc);
#pragma unroll
                    for (int k = 0; k < kBK / 32; ++k)
                        wgmma_m64n256k16_bf16(both, wgmma_desc_sw128(sa + k * 32),
                                              wgmma_desc_sw128(sbm + k * 32), 1);
                } else {
#pragma unroll
                    for (int k = 0; k < kBK / 32; ++k)
                        wgmma_m64n128k16_bf16(acc[0], wgmma_desc_sw128(sa + k * 32),
                                              wgmma_desc_sw128(sbm + k * 32), 1);
                }
                wgmma_commit();
                if (kb > 0) {
                    wgmma_wait<1>();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&s.empty[(it - 1) % kStages]);
                }
            }
            finish_bf16_tile(s, acc, it, lane);
        } else {
            const float* xs = a.xs + int64_t{p0} * n_kb;
            const float* ws =
                (a.ws_last && tl.e == E - 1 ? a.ws_last : a.ws + tl.e * a.ws_per_expert) +
                int64_t{c0 / 128} * ws_ld;
            float d[64];
            // This thread's scales of k-block kb, loaded one k-block ahead: a global load takes
            // about as long as one k-block's MMAs, and waiting for it would idle the tensor cores.
            float nx0 = 0.0f, nx1 = 0.0f, nw0 = 0.0f, nw1 = 0.0f;
            const auto load_scales = [&](int kb) {
                nx0 = r0 < m4 ? xs[int64_t{kb} * m4 + r0] : 0.0f;
                nx1 = r1 < m4 ? xs[int64_t{kb} * m4 + r1] : 0.0f;
                nw0 = ws[kb];
                nw1 = second ? ws[ws_ld + kb] : 0.0f;
            };
            load_scales(0);
            // The MMAs' descriptors by addition: a descriptor's low bits are the shared address /
            // 16 (every address of the block is below 256 KB, so no field overflows), so stage st,
            // half h and k32 step k add st · (stage bytes / 16), h · (half bytes / 16) and 2k to
            // the first stage's. Built from the address each time, the descriptors cost ≈ 10
            // instructions per MMA (Nsight Compute, performance-notes session 41), issued by the
            // consumer between its MMAs, in the time the other consumer's MMAs must cover. By
            // addition: 1–4% faster on an H200 (session 44).
            const uint64_t desc_a0 = wgmma_desc_sw128(smem_u32(s.a[0]) + cw * 64 * kBK),
                           desc_b0 = wgmma_desc_sw128(smem_u32(s.b[0]));
            for (int kb = 0; kb < n_kb; ++kb, ++it) {
                const int st = it % kStages;
                const float x0 = nx0, x1 = nx1, w0 = nw0, w1 = nw1;
                if (kb + 1 < n_kb) load_scales(kb + 1);
                mbar_wait(&s.full[st], (it / kStages) & 1);
                const uint64_t da = desc_a0 + uint64_t(st) * (kABytesT >> 4),
                               db = desc_b0 + uint64_t(st) * (kBBytesT >> 4);
                // Each 128-output half: four k32 MMAs into d, wait, d · scales into its
                // accumulators.
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (h == 1 && !second) break;
                    reg_fence_all(d);
                    wgmma_fence();
#pragma unroll
                    for (int k = 0; k < kBK / 32; ++k)
                        wgmma_m64n128k32_e4m3(d, da + 2 * k, db + h * (kHalfBytes >> 4) + 2 * k, k);
                    wgmma_commit();
                    wgmma_wait<0>();
                    reg_fence_all(d);
                    const float f0 = x0 * (h ? w1 : w0), f1 = x1 * (h ? w1 : w0);
#pragma unroll
                    for (int j = 0; j < 64; ++j) acc[h][j] += d[j] * ((j & 2) ? f1 : f0);
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(&s.empty[st]);
            }
        }
        if constexpr (kEpi == Epilogue::Registers) {
            __nv_bfloat16* y = a.y + int64_t{p0} * a.out + c0 + 2 * (lane % 4);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (h == 1 && !second) break;
#pragma unroll
                for (int half_row = 0; half_row < 2; ++half_row) {
                    const int r = (half_row ? r1 : r0) + part_row(h) - part_row(0);
                    if (r >= m4) continue;
                    __nv_bfloat16* row = y + int64_t{r} * a.out + (kTall ? 0 : h * 128);
#pragma unroll
                    for (int i = 0; i < 16; ++i)
                        *reinterpret_cast<__nv_bfloat162*>(row + 8 * i) = __floats2bfloat162_rn(
                            acc[h][4 * i + 2 * half_row], acc[h][4 * i + 2 * half_row + 1]);
                }
            }
        } else {
            const int lrow = tl.mt * kBM + cw * kYRows;  // the consumer's first row in the expert
            static_assert(!kBf16, "bf16 rows are not padded: the register epilogue");
            store_tile_tma(acc, second,
                           smem_u32(base + kYOffset<kStages>) + uint32_t(cw * kYTileBytes), cw, tid,
                           map_y, p0 + lrow, min(kYRows, m4 - lrow), c0);
        }
    }
    // The last tile's stores have finished before the block (and its shared memory) goes.
    if constexpr (kEpi == Epilogue::TmaStore)
        if (tid == 0) bulk_wait<0>();
}

// A row-major matrix of cols bytes per row (e4m3 values, or bf16 ones two bytes each) read in
// boxes of box_rows × 128 bytes (kBK).
CUtensorMap tile_map(const void* base, int64_t rows, int64_t cols, int box_rows) {
    return e4m3_tile_map(base, rows, cols, box_rows, "grouped expert GEMM");
}

// bf16 y [rows, cols] written in boxes of box_rows × 64 outputs (128 bytes) from shared memory in
// the 128-byte swizzle.
CUtensorMap out_map(__nv_bfloat16* y, int64_t rows, int64_t cols, int box_rows) {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
    const cuuint32_t box[2] = {kYChunkCols, static_cast<cuuint32_t>(box_rows)}, elem[2] = {1, 1};
    const CUresult r =
        tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, y, dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CPFILL_CHECK(r == CUDA_SUCCESS,
                 "grouped fp8 GEMM: output tensor map of {} × {} bf16, {}-row boxes, refused ({})",
                 rows, cols, box_rows, static_cast<int>(r));
    return m;
}

int multiprocessors() {
    int dev = 0, n = 0;
    CPFILL_CUDA_CHECK(cudaGetDevice(&dev));
    CPFILL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

template <Epilogue kEpi, bool kBf16 = false, bool kTall = false>
void launch(const CUtensorMap& mx, const CUtensorMap& mw, const CUtensorMap& mw_last,
            const OutMaps& my, const Args& a, cudaStream_t stream) {
    // Per call: the attribute belongs to the current device, and ranks may be threads of one
    // process on several GPUs.
    CPFILL_CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel<kEpi, kBf16, kTall>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kSmemBytes<kEpi>)));
    grouped_kernel<kEpi, kBf16, kTall>
        <<<multiprocessors(), kThreads, kSmemBytes<kEpi>, stream>>>(mx, mw, mw_last, my, a);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool grouped_fp8_supported() { return ::cpfill::cuda::current_device_is_sm90(); }

GroupedBf16Tile grouped_bf16_tile(const GroupedBf16Gemm& g) {
    if (g.tile != GroupedBf16Tile::Auto) return g.tile;
    return g.rows <= kGroupedBf16TallMaxMeanRows * g.n_experts ? GroupedBf16Tile::Tall
                                                               : GroupedBf16Tile::Wide;
}

void grouped_gemm_fp8(const GroupedFp8Gemm& g, cudaStream_t stream) {
    CPFILL_CHECK(g.in % 128 == 0 && g.out % 128 == 0 && g.in > 0 && g.out > 0,
                 "grouped fp8 GEMM: in {} and out {} must be positive multiples of 128", g.in,
                 g.out);
    CPFILL_CHECK(g.n_experts >= 1 && g.n_experts <= kMaxExperts,
                 "grouped fp8 GEMM: {} experts (1 to {})", g.n_experts, kMaxExperts);
    CPFILL_CHECK(g.in <= (int64_t{1} << 30) && g.out * g.n_experts < (int64_t{1} << 31) &&
                     g.n_pad < (int64_t{1} << 31),
                 "grouped fp8 GEMM: {} rows × {} × {} over {} experts is out of range", g.n_pad,
                 g.out, g.in, g.n_experts);
    const bool tma_store = g.epilogue == Epilogue::TmaStore;
    CPFILL_CHECK(tma_store || g.epilogue == Epilogue::Registers,
                 "grouped fp8 GEMM: epilogue {} is neither Registers nor TmaStore",
                 static_cast<int>(g.epilogue));
    CPFILL_CHECK(!tma_store || reinterpret_cast<uintptr_t>(g.y) % 16 == 0,
                 "grouped fp8 GEMM: the TmaStore epilogue needs y 16-byte aligned (y = {})",
                 static_cast<const void*>(g.y));
    const bool apart = g.w_last != nullptr;
    CPFILL_CHECK(apart == (g.ws_last != nullptr),
                 "grouped fp8 GEMM: the last expert's weights and scales are given together");
    if (g.n_pad == 0) return;
    const CUtensorMap mx = tile_map(g.x, g.n_pad, g.in, kBM);
    // The routed experts' map (the last expert's when it is the only one: never read then).
    const int routed = apart ? g.n_experts - 1 : g.n_experts;
    const CUtensorMap mw = routed > 0 ? tile_map(g.w, routed * g.out, g.in, kBN)
                                      : tile_map(g.w_last, g.out, g.in, kBN);
    const CUtensorMap mw_last = apart ? tile_map(g.w_last, g.out, g.in, kBN) : mw;
    OutMaps my{};
    if (tma_store) {
        my.rows64 = out_map(g.y, g.n_pad, g.out, kYBox);
        my.rows8 = out_map(g.y, g.n_pad, g.out, kYBoxMid);
        my.rows4 = out_map(g.y, g.n_pad, g.out, kYBoxTail);
    }
    const Args a{g.xs,
                 g.pfirst,
                 g.n_experts,
                 g.ws,
                 g.ws_per_expert,
                 g.ws_last,
                 static_cast<int>(g.in),
                 static_cast<int>(g.out),
                 g.y};
    if (tma_store)
        launch<Epilogue::TmaStore>(mx, mw, mw_last, my, a, stream);
    else
        launch<Epilogue::Registers>(mx, mw, mw_last, my, a, stream);
}

void grouped_gemm_bf16(const GroupedBf16Gemm& g, cudaStream_t stream) {
    CPFILL_CHECK(g.in % 64 == 0 && g.out % 128 == 0 && g.in > 0 && g.out > 0,
                 "grouped bf16 GEMM: in {} must be a positive multiple of 64 and out {} of 128",
                 g.in, g.out);
    CPFILL_CHECK(g.n_experts >= 1 && g.n_experts <= kMaxExperts,
                 "grouped bf16 GEMM: {} experts (1 to {})", g.n_experts, kMaxExperts);
    CPFILL_CHECK(g.in <= (int64_t{1} << 29) && g.out * g.n_experts < (int64_t{1} << 31) &&
                     g.rows < (int64_t{1} << 31),
                 "grouped bf16 GEMM: {} rows × {} × {} over {} experts is out of range", g.rows,
                 g.out, g.in, g.n_experts);
    CPFILL_CHECK(g.tile == GroupedBf16Tile::Auto || g.tile == GroupedBf16Tile::Wide ||
                     g.tile == GroupedBf16Tile::Tall,
                 "grouped bf16 GEMM: tile {} is none of Auto, Wide, Tall",
                 static_cast<int>(g.tile));
    if (g.rows == 0) return;
    const GroupedBf16Tile tile = grouped_bf16_tile(g);
    const bool tall = tile == GroupedBf16Tile::Tall;
    const CUtensorMap mx = tile_map(g.x, g.rows, 2 * g.in, tall ? TileShape<true>::m : kBM);
    const CUtensorMap mw =
        tile_map(g.w, g.n_experts * g.out, 2 * g.in, tall ? TileShape<true>::n : kBN);
    const Args a{nullptr,
                 g.first,
                 g.n_experts,
                 nullptr,
                 0,
                 nullptr,
                 static_cast<int>(g.in),
                 static_cast<int>(g.out),
                 g.y};
    if (tall)
        launch<Epilogue::Registers, true, true>(mx, mw, mw, OutMaps{}, a, stream);
    else
        launch<Epilogue::Registers, true>(mx, mw, mw, OutMaps{}, a, stream);
}

}  // namespace cpfill::ops::cuda
