// The grouped expert GEMM with bf16 operands (ops/cuda/grouped_fp8.h, grouped_gemm_bf16) against
// the fp64 product of the same bf16 values on the host. Rows are dense (each expert's right after
// the previous one's, as gather_by_expert leaves them), so a 128-row tile of one expert also reads
// the next expert's rows and must write none of them. Expert sizes include 0, 1, every count from 1
// to 40 and counts off the row tiles, more tiles than multiprocessors and more k-blocks than
// pipeline stages; rows after the last stay untouched. Every case runs with both tiles (wide 128 ×
// 256 and tall 256 × 128: a tall tile's second part, or a consumer, may have no rows).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/grouped_fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

constexpr uint16_t kSentinel = 0xc0e0;  // bf16 -7.0: rows no launch may write

struct Case {
    std::vector<int> counts;  // rows per expert
    int64_t in, out;
};

// Values of magnitude 2^-4 … 2^4 per row of x and per output row of w, so that a row read from
// the wrong place is off by far more than the tolerance.
std::vector<uint16_t> random_rows(int64_t rows, int64_t cols, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::uniform_int_distribution<int> mag(-4, 4);
    std::vector<uint16_t> v(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
        const float s = std::ldexp(1.0f, mag(rng));
        for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = f32_to_bf16(u(rng) * s);
    }
    return v;
}

class GroupedBf16 : public ::testing::TestWithParam<oc::GroupedBf16Tile> {};

void run_and_check(const Case& c, uint64_t seed, oc::GroupedBf16Tile tile) {
    const int E = static_cast<int>(c.counts.size());
    const int64_t K = c.in, N = c.out;
    std::vector<int32_t> first(E + 1, 0);
    for (int e = 0; e < E; ++e) first[e + 1] = first[e] + c.counts[e];
    const int64_t rows = first[E];
    std::mt19937_64 rng(seed);
    const std::vector<uint16_t> x = random_rows(rows, K, rng), w = random_rows(E * N, K, rng);
    const std::vector<uint16_t> init((rows + 2) * N, kSentinel);
    cuda::DeviceBuffer dx = upload(x), dw = upload(w), dfirst = upload(first), dy = upload(init);
    oc::GroupedBf16Gemm g;
    g.x = dx.as<__nv_bfloat16>();
    g.rows = rows;
    g.first = dfirst.as<int32_t>();
    g.n_experts = E;
    g.w = dw.as<__nv_bfloat16>();
    g.in = K;
    g.out = N;
    g.y = dy.as<__nv_bfloat16>();
    g.tile = tile;
    oc::grouped_gemm_bf16(g, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> y = download<uint16_t>(dy, init.size());

    std::vector<float> xf(x.size()), wf(w.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
    for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_to_f32(w[i]);
    double worst = 0;
    int64_t checked = 0;
    for (int e = 0; e < E; ++e) {
        for (int64_t r = first[e]; r < first[e + 1]; ++r) {
            for (int64_t o = 0; o < N; o += (r % 5 == 0 ? 1 : 7)) {
                double sum = 0, mag_sum = 0;
                for (int64_t k = 0; k < K; ++k) {
                    const double v = double(xf[r * K + k]) * wf[(e * N + o) * K + k];
                    sum += v;
                    mag_sum += std::abs(v);
                }
                const double got = bf16_to_f32(y[r * N + o]);
                // fp32 accumulation in the tensor cores plus the bf16 rounding of the output.
                const double tol = 1e-4 * mag_sum + std::abs(sum) / 256 + 1e-30;
                const double err = std::abs(got - sum);
                worst = std::max(worst, err / tol);
                ++checked;
                ASSERT_LE(err, tol) << "expert " << e << " row " << r - first[e] << " column " << o
                                    << ": got " << got << ", want " << sum;
            }
        }
    }
    for (int64_t r = rows; r < rows + 2; ++r)
        for (int64_t o = 0; o < N; ++o)
            ASSERT_EQ(y[r * N + o], kSentinel) << "row " << r << " after the last was written";
    std::printf("[ info ] %lld outputs checked, worst error %.3f of the tolerance\n",
                static_cast<long long>(checked), worst);
}

TEST_P(GroupedBf16, SmallExpertsAndEmptyOnes) {
    CPFILL_SKIP_WITHOUT_SM90();
    run_and_check({{0, 3, 130, 0, 257, 1, 4}, 256, 384}, 1, GetParam());
}

// Row counts on both sides of each 64-row part: 64, 65, 127, 128, 129, 191, 192, 193, 255, 256.
TEST_P(GroupedBf16, EveryRowCountUpTo40AndPartBoundaries) {
    CPFILL_SKIP_WITHOUT_SM90();
    Case c{{}, 128, 256};
    for (int k = 1; k <= 40; ++k) c.counts.push_back(k);
    c.counts.insert(c.counts.end(), {300, 0, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256});
    run_and_check(c, 2, GetParam());
}

// 2 × 16 row tiles × 8 output tiles (more than the multiprocessors) and 16 k-blocks of 64 values
// (more than the stages).
TEST_P(GroupedBf16, MoreTilesThanMultiprocessorsAndLongK) {
    CPFILL_SKIP_WITHOUT_SM90();
    run_and_check({{1200, 517, 0, 1280}, 1024, 2048}, 3, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Tiles, GroupedBf16,
                         ::testing::Values(oc::GroupedBf16Tile::Wide, oc::GroupedBf16Tile::Tall),
                         [](const auto& info) {
                             return info.param == oc::GroupedBf16Tile::Wide ? "wide" : "tall";
                         });

// Auto: tall tiles up to 256 rows per expert on average, wide ones above; an explicit tile is kept.
TEST(GroupedBf16Auto, TallUpTo256RowsPerExpertOnAverage) {
    oc::GroupedBf16Gemm g;
    g.n_experts = 256;
    g.rows = 256 * 256;
    EXPECT_EQ(oc::grouped_bf16_tile(g), oc::GroupedBf16Tile::Tall);
    g.rows = 256 * 256 + 1;
    EXPECT_EQ(oc::grouped_bf16_tile(g), oc::GroupedBf16Tile::Wide);
    g.tile = oc::GroupedBf16Tile::Tall;
    EXPECT_EQ(oc::grouped_bf16_tile(g), oc::GroupedBf16Tile::Tall);
}

// A tile none of Auto, Wide, Tall is refused before any work (no GPU needed: the checks come
// first).
TEST(GroupedBf16Args, RefusesAnUnknownTile) {
    oc::GroupedBf16Gemm g;
    g.n_experts = 1;
    g.in = 128;
    g.out = 256;
    g.tile = static_cast<oc::GroupedBf16Tile>(7);
    EXPECT_THROW(oc::grouped_gemm_bf16(g, nullptr), Error);
}

TEST(GroupedBf16Args, RefusesWidthsOffTheBlocks) {
    CPFILL_SKIP_WITHOUT_GPU();
    oc::GroupedBf16Gemm g;
    g.n_experts = 1;
    g.in = 96;
    g.out = 256;
    EXPECT_THROW(oc::grouped_gemm_bf16(g, nullptr), Error);
    g.in = 128;
    g.out = 192;
    EXPECT_THROW(oc::grouped_gemm_bf16(g, nullptr), Error);
}

}  // namespace
}  // namespace cpfill
