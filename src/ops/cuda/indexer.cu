// indexer_topk: two kernels per chunk of queries.
//   scores  one block per (query, tile of 64 entries): S[64 heads, 64 entries] = Q · Kᵀ with bf16
//           WMMA (fp32 accumulation), then score[w] = scale · Σ_h weight_h · ReLU(S[h, w]).
//   top-k   one block per query: radix select of the k-th largest score (4 passes of 8 bits over
//           an order-preserving uint32 image of the floats), then an ordered compaction that keeps
//           every larger score and the lowest-indexed equal ones — the CPU's set (score desc, index
//           asc) — written in ascending entry order.
#include <mma.h>

#include <algorithm>

#include "ops/cuda/indexer.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kMaxHeads = 64;  // WMMA rows (heads, zero-padded)
constexpr int kMaxDim = 128;
constexpr int kEntryTile = 64;
constexpr int kLd = kMaxDim + 8;  // bf16 row stride of Q and K tiles
constexpr int kSLd = kEntryTile + 4;
constexpr int kScoreThreads = 256;
constexpr int kTopkThreads = 512;

__device__ int64_t n_eligible(int64_t p, int ratio, int64_t n_entries) {
    const int64_t e = (p + 1) / ratio;
    return e < n_entries ? e : n_entries;
}

// grid: (queries of the chunk, entry tiles). scores row stride = n_entries.
__global__ void __launch_bounds__(kScoreThreads)
    score_kernel(const __nv_bfloat16* q, const float* weight, const int64_t* pos, int n_heads,
                 int dim, const __nv_bfloat16* keys, int64_t n_entries, int ratio, float scale,
                 float* scores) {
    const int64_t t = blockIdx.x;
    const int64_t w0 = static_cast<int64_t>(blockIdx.y) * kEntryTile;
    const int64_t n_elig = n_eligible(pos[t], ratio, n_entries);
    if (w0 >= n_elig) return;
    // Q and K tiles while multiplying; the fp32 products S afterwards (aliases them).
    __shared__ __align__(128) unsigned char raw[2 * kMaxHeads * kLd * 2];
    __shared__ float w_s[kMaxHeads];
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(raw);
    __nv_bfloat16* ks = qs + kMaxHeads * kLd;
    float* S = reinterpret_cast<float*>(raw);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int chunks = dim / 8;  // 16-byte chunks per row
    for (int i = tid; i < kMaxHeads * chunks; i += kScoreThreads) {
        const int r = i / chunks, c = (i % chunks) * 8;
        uint4 vq = make_uint4(0, 0, 0, 0), vk = make_uint4(0, 0, 0, 0);
        if (r < n_heads) vq = *reinterpret_cast<const uint4*>(q + (t * n_heads + r) * dim + c);
        if (w0 + r < n_elig) vk = *reinterpret_cast<const uint4*>(keys + (w0 + r) * dim + c);
        *reinterpret_cast<uint4*>(qs + r * kLd + c) = vq;
        *reinterpret_cast<uint4*>(ks + r * kLd + c) = vk;
    }
    if (tid < kMaxHeads) w_s[tid] = tid < n_heads ? weight[t * n_heads + tid] : 0.0f;
    __syncthreads();

    // Warp w: head rows 16·(w/2) …, entry columns 32·(w%2) … (two 16×16 fragments).
    const int rf = warp / 2, cf = (warp % 2) * 2;
    const bool active = rf * 16 < n_heads;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    if (active) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::fill_fragment(acc[0], 0.0f);
        wmma::fill_fragment(acc[1], 0.0f);
        for (int kk = 0; kk < dim; kk += 16) {
            wmma::load_matrix_sync(fa, qs + rf * 16 * kLd + kk, kLd);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(fb, ks + (cf + j) * 16 * kLd + kk, kLd);
                wmma::mma_sync(acc[j], fa, fb, acc[j]);
            }
        }
    }
    __syncthreads();  // all warps are done with qs / ks before S overwrites them
    if (active) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(S + rf * 16 * kSLd + (cf + j) * 16, acc[j], kSLd,
                                    wmma::mem_row_major);
    }
    __syncthreads();

    // 4 threads per entry, heads part, part + 4, …
    const int e = tid / 4, part = tid % 4;
    float sum = 0.0f;
    for (int h = part; h < n_heads; h += 4) sum += w_s[h] * fmaxf(S[h * kSLd + e], 0.0f);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (part == 0 && w0 + e < n_elig) scores[blockIdx.x * n_entries + w0 + e] = sum * scale;
}

// Order-preserving image of a float (larger float → larger uint); −0 and +0 map alike.
__device__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    if (f == 0.0f) return 0x80000000u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block in thread order; *total gets the block's count.
// Every thread must call it. warp_tot: shared [kTopkThreads / 32].
__device__ int block_scan(bool flag, int* warp_tot, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned b = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warp_tot[warp] = __popc(b);
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < kTopkThreads / 32; ++w) {
        const int v = warp_tot[w];
        before += w < warp ? v : 0;
        all += v;
    }
    __syncthreads();  // warp_tot is reused by the next call
    *total = all;
    return before + __popc(b & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(kTopkThreads)
    topk_kernel(const float* scores, const int64_t* pos, int64_t n_entries, int ratio,
                int64_t top_k, int32_t* idx) {
    const int64_t t = blockIdx.x;
    const int tid = threadIdx.x;
    const int n = static_cast<int>(n_eligible(pos[t], ratio, n_entries));
    const float* s = scores + t * n_entries;
    int32_t* out = idx + t * top_k;
    if (n <= top_k) {  // everything eligible is selected
        for (int64_t i = tid; i < top_k; i += kTopkThreads)
            out[i] = i < n ? static_cast<int32_t>(i) : -1;
        return;
    }
    const int k = static_cast<int>(top_k);
    __shared__ unsigned hist[256];
    __shared__ uint32_t prefix_s;
    __shared__ int remaining_s;
    __shared__ int warp_tot[kTopkThreads / 32];
    uint32_t prefix = 0, mask = 0;
    int remaining = k;  // how many of the keys matching `prefix` still to take
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += kTopkThreads) {
            const uint32_t u = order_key(s[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) {
            // Lane l holds bins 255 − 8l … 248 − 8l (from the top); find the bin holding the
            // remaining-th largest key.
            unsigned c = 0;
            for (int b = 0; b < 8; ++b) c += hist[255 - 8 * tid - b];
            unsigned incl = c;
            for (int off = 1; off < 32; off <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
                if (tid >= off) incl += v;
            }
            const unsigned hit =
                __ballot_sync(0xffffffffu, incl >= static_cast<unsigned>(remaining));
            if (tid == __ffs(hit) - 1) {
                unsigned cum = incl - c;
                for (int b = 0; b < 8; ++b) {
                    const int bin = 255 - 8 * tid - b;
                    if (cum + hist[bin] >= static_cast<unsigned>(remaining)) {
                        remaining_s = remaining - static_cast<int>(cum);
                        prefix_s = prefix | (static_cast<uint32_t>(bin) << shift);
                        break;
                    }
                    cum += hist[bin];
                }
            }
        }
        __syncthreads();
        prefix = prefix_s;
        remaining = remaining_s;
        mask |= 255u << shift;
    }
    // prefix is the k-th largest key; take all larger ones and the first `remaining` equal ones.
    int written = 0, eq_before = 0;
    for (int i0 = 0; i0 < n && written < k; i0 += kTopkThreads) {
        const int i = i0 + tid;
        const uint32_t u = i < n ? order_key(s[i]) : 0u;
        const bool eq = i < n && u == prefix;
        int eq_total = 0, sel_total = 0;
        const int eq_rank = eq_before + block_scan(eq, warp_tot, &eq_total);
        const bool sel = (i < n && u > prefix) || (eq && eq_rank < remaining);
        const int at = written + block_scan(sel, warp_tot, &sel_total);
        if (sel) out[at] = i;
        written += sel_total;
        eq_before += eq_total;
    }
    for (int64_t i = k + tid; i < top_k; i += kTopkThreads) out[i] = -1;
}

}  // namespace

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
    const int64_t n_ent = std::max<int64_t>(a.n_entries, 1);
    CPFILL_CHECK(scores_floats >= n_ent, "indexer: scores scratch of {} floats, need ≥ {}",
                 scores_floats, n_ent);
    const int64_t tiles = (a.n_entries + kEntryTile - 1) / kEntryTile;
    CPFILL_CHECK(tiles <= 65535, "indexer: {} entries exceed {} per call", a.n_entries,
                 int64_t{65535} * kEntryTile);
    const int64_t chunk = std::min<int64_t>({scores_floats / n_ent, a.n_q, int64_t{1} << 30});
    for (int64_t t0 = 0; t0 < a.n_q; t0 += chunk) {
        const int64_t rows = std::min(chunk, a.n_q - t0);
        if (tiles > 0) {
            const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(tiles));
            score_kernel<<<grid, kScoreThreads, 0, stream>>>(
                a.q + t0 * a.n_heads * a.dim, a.weight + t0 * a.n_heads, a.pos + t0, a.n_heads,
                a.dim, a.keys, a.n_entries, a.ratio, a.scale, scores);
            CPFILL_CUDA_CHECK(cudaGetLastError());
        }
        topk_kernel<<<static_cast<unsigned>(rows), kTopkThreads, 0, stream>>>(
            scores, a.pos + t0, n_ent, a.ratio, a.top_k, a.idx + t0 * a.top_k);
        CPFILL_CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace cpfill::ops::cuda
