// Indexer top-k on the GPU against ops/indexer.h, comparing the selected sets per query:
//  * integer data (scores exact in fp32 on both sides, many exact ties): the sets must be equal —
//    the tie rule (lower index first) included;
//  * random data (bf16 operands, fp32 sums in a different order): an entry may differ only where
//    its CPU score lies within 1e-4 of the tensor's scale from the CPU's k-th score (a near-tie).
// Also: −1 padding after min(top_k, eligible) entries, ascending order, chunked scratch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cuda_test_util.h"
#include "ops/cuda/indexer.h"
#include "ops/indexer.h"

namespace cpfill {
namespace {

using namespace test_cuda;

struct IndexerCase {
    int n_heads, dim;
    int64_t n_tokens;  // entries = n_tokens / 4
    int64_t top_k;
    bool integer;          // exact integer data, scale 1
    int64_t scratch_rows;  // queries per scores chunk (0: all)
    std::vector<int64_t> pos;
};

std::vector<float> random_ints(size_t n, uint64_t seed, int lo, int hi) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(u(rng));
    return v;
}

class CudaIndexer : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(CudaIndexer, SelectsTheCpuSet) {
    CPFILL_SKIP_WITHOUT_GPU();
    const IndexerCase c = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "heads " << c.n_heads << ", dim " << c.dim << ", tokens " << c.n_tokens
                 << ", top_k " << c.top_k << ", integer " << c.integer << ", seeds 80-82");
    const int ratio = 4;
    const int64_t n_q = static_cast<int64_t>(c.pos.size()), n_ent = c.n_tokens / ratio;
    const int64_t hd = int64_t{c.n_heads} * c.dim;
    std::vector<float> q, keys, w;
    float scale;
    if (c.integer) {
        q = random_ints(n_q * hd, 80, -3, 3);
        keys = random_ints(n_ent * c.dim, 81, -2, 2);
        w = random_ints(n_q * c.n_heads, 82, -1, 3);
        scale = 1.0f;
    } else {
        q = random_bf16(n_q * hd, 80);
        keys = random_bf16(n_ent * c.dim, 81);
        w = random_f32(n_q * c.n_heads, 82, 1.0f / std::sqrt(static_cast<float>(c.n_heads)));
        scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    }

    auto dq = cuda::upload_bf16(q.data(), q.size());
    auto dkeys = cuda::upload_bf16(keys.data(), std::max<size_t>(keys.size(), 1));
    auto dw = upload(w), dpos = upload(c.pos);
    cuda::DeviceBuffer didx(n_q * c.top_k * 4);
    const int64_t rows = c.scratch_rows ? c.scratch_rows : n_q;
    cuda::DeviceBuffer dscores(rows * std::max<int64_t>(n_ent, 1) * 4);
    ops::cuda::IndexerArgs a;
    a.q = dq.as<__nv_bfloat16>();
    a.weight = dw.as<float>();
    a.pos = dpos.as<int64_t>();
    a.n_q = n_q;
    a.n_heads = c.n_heads;
    a.dim = c.dim;
    a.keys = dkeys.as<__nv_bfloat16>();
    a.n_entries = n_ent;
    a.ratio = ratio;
    a.top_k = c.top_k;
    a.scale = scale;
    a.idx = didx.as<int32_t>();
    ops::cuda::indexer_topk(a, dscores.as<float>(), rows * std::max<int64_t>(n_ent, 1), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    auto got = download<int32_t>(didx, n_q * c.top_k);

    std::vector<int32_t> ref(c.top_k);
    std::vector<float> scratch, score(n_ent);
    int64_t near_ties = 0;
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t elig = std::min((c.pos[i] + 1) / ratio, n_ent);
        scratch.resize((c.n_heads + 1) * std::max<int64_t>(elig, 1));
        const int64_t k =
            ops::indexer_select(q.data() + i * hd, w.data() + i * c.n_heads, c.n_heads, c.dim,
                                keys.data(), elig, c.top_k, scale, ref.data(), scratch.data());
        const float* s_cpu = scratch.data() + c.n_heads * elig;  // the CPU's scores
        const int32_t* g = got.data() + i * c.top_k;
        SCOPED_TRACE(testing::Message() << "query " << i << " at position " << c.pos[i]);
        for (int64_t j = 0; j < c.top_k; ++j) {
            if (j < k) {
                ASSERT_GE(g[j], 0) << "slot " << j << " of " << k;
                ASSERT_LT(g[j], elig);
                if (j > 0) {
                    ASSERT_LT(g[j - 1], g[j]) << "not ascending at slot " << j;
                }
            } else {
                ASSERT_EQ(g[j], -1) << "padding slot " << j;
            }
        }
        std::set<int32_t> a_set(g, g + k), b_set(ref.begin(), ref.begin() + k);
        if (a_set == b_set) continue;
        ASSERT_FALSE(c.integer) << "exact scores, yet the sets differ";
        float scale_s = 0;
        for (int64_t e = 0; e < elig; ++e) scale_s = std::max(scale_s, std::abs(s_cpu[e]));
        const float kth = s_cpu[ref[k - 1]];
        for (int32_t e : a_set)
            if (!b_set.count(e)) {
                EXPECT_LE(std::abs(s_cpu[e] - kth), 1e-4f * scale_s) << "entry " << e;
                ++near_ties;
            }
    }
    if (near_ties) std::printf("[ info ] %lld near-tie swaps\n", static_cast<long long>(near_ties));
}

std::vector<int64_t> positions(int64_t from, int64_t to, int64_t step) {
    std::vector<int64_t> p;
    for (int64_t x = from; x < to; x += step) p.push_back(x);
    return p;
}

std::vector<int64_t> edges() { return {0, 1, 2, 3, 4, 7, 8, 63, 64, 65, 66, 67, 130, 399}; }

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaIndexer,
    ::testing::Values(
        IndexerCase{4, 128, 400, 16, true, 0, edges()},   // tiny preset, exact ties
        IndexerCase{64, 128, 400, 16, true, 3, edges()},  // 64 heads, chunks of 3 queries
        IndexerCase{17, 64, 3000, 100, true, 0, positions(0, 3000, 37)},
        IndexerCase{4, 128, 400, 16, false, 0, edges()},
        IndexerCase{64, 128, 5000, 512, false, 0, positions(0, 5000, 61)},      // V4-Flash
        IndexerCase{64, 128, 9000, 1024, false, 7, positions(4000, 9000, 97)},  // V4-Pro
        IndexerCase{33, 48, 260, 1, false, 0, positions(0, 260, 1)}));

TEST(CudaIndexerTiming, FlashShape) {
    CPFILL_SKIP_WITHOUT_GPU();
    // 1024 queries at positions 15360…16383 over 4096 entries, 64 heads × 128, top-512.
    const int n_heads = 64, dim = 128;
    const int64_t n_q = 1024, n_ent = 4096, top_k = 512;
    std::vector<int64_t> pos(n_q);
    for (int64_t i = 0; i < n_q; ++i) pos[i] = 15360 + i;
    auto dq = cuda::upload_bf16(random_bf16(n_q * n_heads * dim, 90).data(), n_q * n_heads * dim);
    auto dkeys = cuda::upload_bf16(random_bf16(n_ent * dim, 91).data(), n_ent * dim);
    auto dw = upload(random_f32(n_q * n_heads, 92, 0.125f)), dpos = upload(pos);
    cuda::DeviceBuffer didx(n_q * top_k * 4), dscores(n_q * n_ent * 4);
    ops::cuda::IndexerArgs a;
    a.q = dq.as<__nv_bfloat16>();
    a.weight = dw.as<float>();
    a.pos = dpos.as<int64_t>();
    a.n_q = n_q;
    a.n_heads = n_heads;
    a.dim = dim;
    a.keys = dkeys.as<__nv_bfloat16>();
    a.n_entries = n_ent;
    a.top_k = top_k;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    a.idx = didx.as<int32_t>();
    const double ms =
        time_ms([&] { ops::cuda::indexer_topk(a, dscores.as<float>(), n_q * n_ent, nullptr); });
    const double flops = 2.0 * n_q * n_ent * n_heads * dim;
    std::printf(
        "[ timing ] indexer %lld queries x %lld entries, top-%lld: %.3f ms, %.1f TFLOP/s "
        "(scores + top-k)\n",
        static_cast<long long>(n_q), static_cast<long long>(n_ent), static_cast<long long>(top_k),
        ms, flops / (ms * 1e-3) / 1e12);
}

}  // namespace
}  // namespace cpfill
