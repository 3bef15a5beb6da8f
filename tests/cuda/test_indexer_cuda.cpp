// Indexer top-k on the GPU against ops/indexer.h, comparing the selected sets per query:
//  * integer data (scores exact in fp32 on both sides, many exact ties): the sets must be equal —
//    the tie rule (lower index first) included;
//  * random data (bf16 operands, fp32 sums in a different order): an entry may differ only where
//    its CPU score lies within 1e-4 of the tensor's scale from the CPU's k-th score (a near-tie).
// Where all queries run in one chunk every eligible bf16 score must also be within 1e-4 of its
// row's largest magnitude of the CPU's. On Hopper the bf16 cases run both scoring kernels (the
// wgmma one indexer_topk picks there, and the mma.sync one of other GPUs).
// Also: −1 padding after min(top_k, eligible) entries, ascending order, every slot written (the
// outputs and the scores scratch are poisoned first), chunked scratch. The grid of shapes covers
// heads < 64, dims 16 … 128, query counts that are no multiple of the kernel's 8 per block,
// unsorted positions, eligible counts on both sides of the scoring kernel's 16-key, 128-key and
// 2048-entry steps and of the top-k kernel's 24576-entry cache. DISABLED_ timing tests at 64k and
// 128k tokens print the scoring rate and the top-k time apart.
// The fp8 indexer (IndexerPrecision::Fp8) runs the same cases against the CPU on the queries and
// keys rounded to e4m3 per row (scale amax / 448, as ops::round_indexer_rows(Fp8)): its sets may
// differ only by near-ties within 1e-3 of the scale (Hopper's fp8 MMAs add with fewer bits than
// fp32), and where all queries run in one chunk every eligible score must be within 2e-3 of its
// row's largest magnitude of the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/indexer_hopper.h"
#include "ops/indexer.h"

namespace cpfill {
namespace {

using namespace test_cuda;

constexpr int kRatio = 4;

std::vector<float> random_ints(size_t n, uint64_t seed, int lo, int hi) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(u(rng));
    return v;
}

// One indexer call on the host; query i uses the q and weight rows i % period (the timing tests
// repeat a few thousand distinct queries instead of drawing gigabytes).
struct HostIndexer {
    int n_heads = 0, dim = 0;
    int64_t n_ent = 0, top_k = 0, period = 0;
    float scale = 0.0f;
    std::vector<float> q;     // [period, n_heads, dim], bf16-exact
    std::vector<float> w;     // [period, n_heads]
    std::vector<float> keys;  // [n_ent, dim], bf16-exact
    std::vector<int64_t> pos;

    int64_t n_q() const { return static_cast<int64_t>(pos.size()); }
    const float* q_row(int64_t i) const { return q.data() + (i % period) * n_heads * dim; }
    const float* w_row(int64_t i) const { return w.data() + (i % period) * n_heads; }
    int64_t eligible(int64_t i) const { return std::min((pos[i] + 1) / kRatio, n_ent); }
};

// Seeds 80–82: integer data (scale 1) or normal bf16 queries and keys with n_heads^−½ weights.
HostIndexer make_inputs(int n_heads, int dim, int64_t n_ent, int64_t top_k, bool integer,
                        std::vector<int64_t> pos, int64_t period) {
    HostIndexer h;
    h.n_heads = n_heads;
    h.dim = dim;
    h.n_ent = n_ent;
    h.top_k = top_k;
    h.pos = std::move(pos);
    h.period = std::min<int64_t>(period, h.n_q());
    const int64_t hd = int64_t{n_heads} * dim;
    if (integer) {
        h.q = random_ints(h.period * hd, 80, -3, 3);
        h.keys = random_ints(n_ent * dim, 81, -2, 2);
        h.w = random_ints(h.period * n_heads, 82, -1, 3);
        h.scale = 1.0f;
    } else {
        h.q = random_bf16(h.period * hd, 80);
        h.keys = random_bf16(n_ent * dim, 81);
        h.w = random_f32(h.period * n_heads, 82, 1.0f / std::sqrt(static_cast<float>(n_heads)));
        h.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    }
    return h;
}

// Each row of `dim` values rounded to e4m3 with the scale amax / 448 (1 when all are 0): the fp8
// indexer's quantisation, a 128-channel block being the whole row (dim ≤ 128).
void round_rows_e4m3(std::vector<float>& v, int dim) {
    for (size_t r = 0; r < v.size(); r += dim) {
        float amax = 0.0f;
        for (int j = 0; j < dim; ++j) amax = std::max(amax, std::abs(v[r + j]));
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (int j = 0; j < dim; ++j) v[r + j] = e4m3_to_f32(f32_to_e4m3(v[r + j] / s)) * s;
    }
}

HostIndexer rounded_e4m3(HostIndexer h) {
    round_rows_e4m3(h.q, h.dim);
    round_rows_e4m3(h.keys, h.dim);
    return h;
}

// `total` bytes on the device holding src's first `period` bytes over and over.
cuda::DeviceBuffer repeat(cuda::DeviceBuffer src, size_t period, size_t total) {
    if (period >= total) return src;
    cuda::DeviceBuffer b(total);
    for (size_t at = 0; at < total; at += period)
        CPFILL_CUDA_CHECK(cudaMemcpy(b.as<char>() + at, src.as<char>(),
                                     std::min(period, total - at), cudaMemcpyDeviceToDevice));
    return b;
}

// The device side of a HostIndexer: inputs, the idx output and a scores scratch for
// `scratch_rows` queries per chunk (0: all), both poisoned with 0x7f7f7f7f (an index past every
// eligible count, a score of 3.4e38 that the top-k would pick if it read an unwritten one).
struct DeviceIndexer {
    cuda::DeviceBuffer q, w, keys, pos, idx, scores;
    int64_t scores_floats = 0;
    ops::cuda::IndexerArgs args;

    DeviceIndexer(const HostIndexer& h, int64_t scratch_rows,
                  ops::cuda::IndexerPrecision precision = ops::cuda::IndexerPrecision::Bf16) {
        const int64_t n_q = h.n_q(), hd = int64_t{h.n_heads} * h.dim;
        q = repeat(cuda::upload_bf16(h.q.data(), h.q.size()), h.q.size() * 2, n_q * hd * 2);
        w = repeat(upload(h.w), h.w.size() * 4, n_q * h.n_heads * 4);
        keys = cuda::upload_bf16(h.keys.data(), std::max<size_t>(h.keys.size(), 1));
        pos = upload(h.pos);
        idx = cuda::DeviceBuffer(n_q * h.top_k * 4);
        scores_floats = ops::cuda::indexer_scratch_floats(precision, h.n_ent,
                                                          scratch_rows ? scratch_rows : n_q);
        scores = cuda::DeviceBuffer(scores_floats * 4);
        args.q = q.as<__nv_bfloat16>();
        args.weight = w.as<float>();
        args.pos = pos.as<int64_t>();
        args.n_q = n_q;
        args.n_heads = h.n_heads;
        args.dim = h.dim;
        args.keys = keys.as<__nv_bfloat16>();
        args.n_entries = h.n_ent;
        args.ratio = kRatio;
        args.top_k = h.top_k;
        args.scale = h.scale;
        args.idx = idx.as<int32_t>();
        args.precision = precision;
    }

    std::vector<int32_t> run() {
        CPFILL_CUDA_CHECK(cudaMemset(idx.as<void>(), 0x7f, idx.bytes()));
        CPFILL_CUDA_CHECK(cudaMemset(scores.as<void>(), 0x7f, scores.bytes()));
        ops::cuda::indexer_topk(args, scores.as<float>(), scores_floats, nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        return download<int32_t>(idx, args.n_q * args.top_k);
    }
};

// Checks the GPU's selection `got` [n_q, top_k] of the queries `which` against indexer_select:
// layout (ascending indices, then −1) and the set, equal or differing only by near-ties (never
// for `exact` data). Adds the near-tie swaps to *near_ties.
void expect_cpu_sets(const HostIndexer& h, const std::vector<int32_t>& got,
                     const std::vector<int64_t>& which, bool exact, int64_t* near_ties,
                     float near = 1e-4f, const std::vector<float>* gpu_scores = nullptr,
                     float score_tol = 2e-3f) {
    std::vector<int32_t> ref(h.top_k);
    std::vector<float> scratch;
    for (int64_t i : which) {
        const int64_t elig = h.eligible(i);
        scratch.resize((h.n_heads + 1) * std::max<int64_t>(elig, 1));
        const int64_t k =
            ops::indexer_select(h.q_row(i), h.w_row(i), h.n_heads, h.dim, h.keys.data(), elig,
                                h.top_k, h.scale, ref.data(), scratch.data());
        const float* s_cpu = scratch.data() + h.n_heads * elig;  // the CPU's scores
        const int32_t* g = got.data() + i * h.top_k;
        SCOPED_TRACE(testing::Message() << "query " << i << " at position " << h.pos[i] << ", "
                                        << elig << " eligible");
        float scale_s = 0;
        for (int64_t e = 0; e < elig; ++e) scale_s = std::max(scale_s, std::abs(s_cpu[e]));
        if (gpu_scores) {  // every eligible score, against the row's largest magnitude
            const float* sg = gpu_scores->data() + i * h.n_ent;
            for (int64_t e = 0; e < elig; ++e)
                ASSERT_LE(std::abs(sg[e] - s_cpu[e]), score_tol * scale_s)
                    << "score of entry " << e << ": " << sg[e] << " against " << s_cpu[e];
        }
        for (int64_t j = 0; j < h.top_k; ++j) {
            if (j < k) {
                ASSERT_GE(g[j], 0) << "slot " << j << " of " << k;
                ASSERT_LT(g[j], elig) << "slot " << j;
                if (j > 0) {
                    ASSERT_LT(g[j - 1], g[j]) << "not ascending at slot " << j;
                }
            } else {
                ASSERT_EQ(g[j], -1) << "padding slot " << j;
            }
        }
        std::set<int32_t> a_set(g, g + k), b_set(ref.begin(), ref.begin() + k);
        if (a_set == b_set) continue;
        ASSERT_FALSE(exact) << "exact scores, yet the sets differ";
        const float kth = s_cpu[ref[k - 1]];
        for (int32_t e : a_set)
            if (!b_set.count(e)) {
                EXPECT_LE(std::abs(s_cpu[e] - kth), near * scale_s) << "entry " << e;
                ++*near_ties;
            }
    }
}

struct IndexerCase {
    int n_heads, dim;
    int64_t n_tokens;  // entries = n_tokens / 4
    int64_t top_k;
    bool integer;          // exact integer data, scale 1
    int64_t scratch_rows;  // queries per scores chunk (0: all)
    std::vector<int64_t> pos;
};

class CudaIndexer : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(CudaIndexer, SelectsTheCpuSet) {
    CPFILL_SKIP_WITHOUT_GPU();
    const IndexerCase c = GetParam();
    const HostIndexer h = make_inputs(c.n_heads, c.dim, c.n_tokens / kRatio, c.top_k, c.integer,
                                      c.pos, static_cast<int64_t>(c.pos.size()));
    std::vector<int64_t> all(h.n_q());
    for (int64_t i = 0; i < h.n_q(); ++i) all[i] = i;
    const bool hopper = ops::cuda::indexer_hopper::supported();
    for (bool mma_sync : {false, true}) {
        if (mma_sync && !hopper) continue;  // elsewhere the first run was the mma.sync kernel
        SCOPED_TRACE(testing::Message()
                     << (hopper && !mma_sync ? "wgmma" : "mma.sync") << " kernel: heads "
                     << c.n_heads << ", dim " << c.dim << ", tokens " << c.n_tokens << ", top_k "
                     << c.top_k << ", integer " << c.integer << ", chunk rows " << c.scratch_rows
                     << ", seeds 80-82");
        DeviceIndexer d(h, c.scratch_rows);
        d.args.mma_sync = mma_sync;
        const std::vector<int32_t> got = d.run();
        std::vector<float> scores;  // one chunk: every query's scores are still in the scratch
        if (c.scratch_rows == 0) scores = download<float>(d.scores, h.n_q() * h.n_ent);
        int64_t near_ties = 0;
        expect_cpu_sets(h, got, all, c.integer, &near_ties, 1e-4f,
                        c.scratch_rows == 0 ? &scores : nullptr, 1e-4f);
        if (near_ties)
            std::printf("[ info ] %lld near-tie swaps\n", static_cast<long long>(near_ties));
    }
}

std::vector<int64_t> positions(int64_t from, int64_t to, int64_t step) {
    std::vector<int64_t> p;
    for (int64_t x = from; x < to; x += step) p.push_back(x);
    return p;
}

std::vector<int64_t> edges() { return {0, 1, 2, 3, 4, 7, 8, 63, 64, 65, 66, 67, 130, 399}; }

// 18 queries whose eligible counts straddle the 16-key sub-tiles, the 128-key tiles and the
// 2048-entry splits of the mma.sync scoring kernel (position 4e − 1 has e eligible entries, 4e + 2
// too); the wgmma kernel's 16384-entry splits are straddled by the last case of indexer_cases().
std::vector<int64_t> tile_edges() {
    std::vector<int64_t> p;
    for (int64_t e : {1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049, 2111, 4096, 4097})
        p.push_back(4 * e - 1);
    p.push_back(4 * 65 + 2);
    p.push_back(4 * 2048 + 2);
    return p;
}

std::vector<int64_t> reversed(std::vector<int64_t> p) {
    std::reverse(p.begin(), p.end());
    return p;
}

std::vector<IndexerCase> indexer_cases() {
    return {
        IndexerCase{4, 128, 400, 16, true, 0, edges()},   // tiny preset, exact ties
        IndexerCase{64, 128, 400, 16, true, 3, edges()},  // 64 heads, chunks of 3 queries
        IndexerCase{17, 64, 3000, 100, true, 0, positions(0, 3000, 37)},
        IndexerCase{4, 128, 400, 16, false, 0, edges()},
        IndexerCase{64, 128, 5000, 512, false, 0, positions(0, 5000, 61)},      // V4-Flash
        IndexerCase{64, 128, 9000, 1024, false, 7, positions(4000, 9000, 97)},  // V4-Pro
        IndexerCase{33, 48, 260, 1, false, 0, positions(0, 260, 1)},
        // Tile and split edges: exact at the model's shape; random with 48 heads × 64,
        // positions descending, chunks of 5 queries.
        IndexerCase{64, 128, 16500, 64, true, 0, tile_edges()},
        IndexerCase{48, 64, 16500, 200, false, 5, reversed(tile_edges())},
        // The smallest shape, one query per block row, chunks of 3.
        IndexerCase{1, 16, 1000, 8, true, 3, positions(0, 1000, 13)},
        // Eligible counts top_k − 1 … top_k + 2, one query per chunk; dim 96 (6 k-steps).
        IndexerCase{64, 128, 1200, 100, true, 1, {395, 399, 403, 404, 407, 1199}},
        IndexerCase{64, 96, 3000, 30, false, 0, positions(1, 3000, 29)},
        // Exact ties across the top-k cache (24576 entries); random data at the 64k shape in
        // chunks of 2 (16384, 16385 and 16500 eligible: both sides of the wgmma kernel's split).
        IndexerCase{8,
                    64,
                    100000,
                    512,
                    true,
                    0,
                    {99999, 98303, 98307, 65535, 40003, 32767, 32771, 2051, 8191}},
        IndexerCase{64, 128, 66000, 512, false, 2, {65999, 65535, 65540, 30000, 12}}};
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaIndexer, ::testing::ValuesIn(indexer_cases()));

class CudaIndexerFp8 : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(CudaIndexerFp8, SelectsTheCpuSetOfE4m3Rows) {
    CPFILL_SKIP_WITHOUT_GPU();
    if (!ops::cuda::indexer_hopper::supported()) GTEST_SKIP() << "needs compute capability 9.0";
    const IndexerCase c = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "fp8: heads " << c.n_heads << ", dim " << c.dim << ", tokens " << c.n_tokens
                 << ", top_k " << c.top_k << ", integer " << c.integer << ", chunk rows "
                 << c.scratch_rows << ", seeds 80-82");
    const HostIndexer h = make_inputs(c.n_heads, c.dim, c.n_tokens / kRatio, c.top_k, c.integer,
                                      c.pos, static_cast<int64_t>(c.pos.size()));
    DeviceIndexer d(h, c.scratch_rows, ops::cuda::IndexerPrecision::Fp8);
    const std::vector<int32_t> got = d.run();
    std::vector<int64_t> all(h.n_q());
    for (int64_t i = 0; i < h.n_q(); ++i) all[i] = i;
    std::vector<float> scores;  // one chunk: every query's scores are still in the scratch
    if (c.scratch_rows == 0) scores = download<float>(d.scores, h.n_q() * h.n_ent);
    int64_t near_ties = 0;
    expect_cpu_sets(rounded_e4m3(h), got, all, false, &near_ties, 1e-3f,
                    c.scratch_rows == 0 ? &scores : nullptr);
    if (near_ties) std::printf("[ info ] %lld near-tie swaps\n", static_cast<long long>(near_ties));
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaIndexerFp8, ::testing::ValuesIn(indexer_cases()));

struct SplitTimes {
    double all_ms = 0, score_ms = 0, topk_ms = 0;
};

// Times one indexer_topk call, and apart its scoring kernels and its top-k kernels: the call is
// captured into a CUDA graph whose kernel nodes are split by kernel name ("score" or not) into
// two graphs. Alone, the top-k graph re-reads the last chunk's scores (same sizes, other values).
SplitTimes time_split(const DeviceIndexer& d) {
    cudaStream_t stream = nullptr;
    CPFILL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ops::cuda::indexer_topk(d.args, d.scores.as<float>(), d.scores_floats, stream);  // warm-up
    CPFILL_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graphs[3] = {};  // the call, its scoring kernels, its top-k kernels
    CPFILL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    ops::cuda::indexer_topk(d.args, d.scores.as<float>(), d.scores_floats, stream);
    CPFILL_CUDA_CHECK(cudaStreamEndCapture(stream, &graphs[0]));
    size_t n_nodes = 0;
    CPFILL_CUDA_CHECK(cudaGraphGetNodes(graphs[0], nullptr, &n_nodes));
    std::vector<cudaGraphNode_t> nodes(n_nodes);
    CPFILL_CUDA_CHECK(cudaGraphGetNodes(graphs[0], nodes.data(), &n_nodes));
    cudaGraphNode_t tail[3] = {};
    for (int g = 1; g < 3; ++g) CPFILL_CUDA_CHECK(cudaGraphCreate(&graphs[g], 0));
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        CPFILL_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
        if (type != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams p;
        CPFILL_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &p));
        const char* name = "";
        CPFILL_CUDA_CHECK(cudaFuncGetName(&name, p.func));
        const int g = std::strstr(name, "score") || std::strstr(name, "quantize") ? 1 : 2;
        cudaGraphNode_t added;
        CPFILL_CUDA_CHECK(cudaGraphAddKernelNode(&added, graphs[g], tail[g] ? &tail[g] : nullptr,
                                                 tail[g] ? 1 : 0, &p));
        tail[g] = added;
    }
    double ms[3] = {};
    for (int g = 0; g < 3; ++g) {
        cudaGraphExec_t exec;
        CPFILL_CUDA_CHECK(cudaGraphInstantiate(&exec, graphs[g], 0));
        ms[g] = time_ms([&] { CPFILL_CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); });
        CPFILL_CUDA_CHECK(cudaGraphExecDestroy(exec));
    }
    for (cudaGraph_t g : graphs) CPFILL_CUDA_CHECK(cudaGraphDestroy(g));
    CPFILL_CUDA_CHECK(cudaStreamDestroy(stream));
    return {ms[0], ms[1], ms[2]};
}

// One CSA layer's indexer over a whole request of n_tokens (queries at positions 0 … n_tokens −
// 1, ratio 4, 64 heads × 128, top-512) with the engine's scratch of 2^26 floats; FLOPs counted as
// 2 · n_heads · dim per (query, eligible entry). Also checks a few queries against the CPU.
void time_context(int64_t n_tokens, ops::cuda::IndexerPrecision precision, bool mma_sync = false) {
    const int64_t period = 2048;  // distinct queries, repeated
    const bool fp8 = precision == ops::cuda::IndexerPrecision::Fp8;
    HostIndexer h =
        make_inputs(64, 128, n_tokens / kRatio, 512, false, positions(0, n_tokens, 1), period);
    const int64_t chunk = (int64_t{1} << 26) / h.n_ent;
    DeviceIndexer d(h, chunk, precision);
    d.args.mma_sync = mma_sync;
    const std::vector<int32_t> got = d.run();
    int64_t near_ties = 0;
    expect_cpu_sets(fp8 ? rounded_e4m3(h) : h, got,
                    {n_tokens - 1, n_tokens / 2 + 3, 4097, 2049, 100, 5}, false, &near_ties,
                    fp8 ? 1e-3f : 1e-4f);
    double flops = 0;
    for (int64_t i = 0; i < h.n_q(); ++i) flops += 2.0 * h.n_heads * h.dim * h.eligible(i);
    const SplitTimes t = time_split(d);
    std::printf(
        "[ timing ] %s indexer %lld tokens (%lld queries x %lld entries, %lld per chunk), 64 heads "
        "x "
        "128, top-512: call %.2f ms (%.1f TFLOP/s); scoring %.2f ms = %.1f TFLOP/s; top-k %.2f "
        "ms; %lld near-tie swaps in the checked queries\n",
        fp8        ? "fp8"
        : mma_sync ? "bf16 (mma.sync)"
                   : "bf16",
        static_cast<long long>(n_tokens), static_cast<long long>(h.n_q()),
        static_cast<long long>(h.n_ent), static_cast<long long>(chunk), t.all_ms,
        flops / (t.all_ms * 1e-3) / 1e12, t.score_ms, flops / (t.score_ms * 1e-3) / 1e12, t.topk_ms,
        static_cast<long long>(near_ties));
}

TEST(CudaIndexerTiming, DISABLED_Context64k) {
    CPFILL_SKIP_WITHOUT_GPU();
    time_context(65536, ops::cuda::IndexerPrecision::Bf16);
}

TEST(CudaIndexerTiming, DISABLED_Context64kMmaSync) {
    CPFILL_SKIP_WITHOUT_GPU();
    time_context(65536, ops::cuda::IndexerPrecision::Bf16, true);
}

TEST(CudaIndexerTiming, DISABLED_Context128k) {
    CPFILL_SKIP_WITHOUT_GPU();
    time_context(131072, ops::cuda::IndexerPrecision::Bf16);
}

TEST(CudaIndexerTiming, DISABLED_Context64kFp8) {
    CPFILL_SKIP_WITHOUT_GPU();
    time_context(65536, ops::cuda::IndexerPrecision::Fp8);
}

TEST(CudaIndexerTiming, DISABLED_Context128kFp8) {
    CPFILL_SKIP_WITHOUT_GPU();
    time_context(131072, ops::cuda::IndexerPrecision::Fp8);
}

}  // namespace
}  // namespace cpfill
