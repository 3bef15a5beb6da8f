// GroupedGemm (cublasGemmGroupedBatchedEx over the routed experts) against the CPU linear per
// expert, with empty experts and awkward sizes; and a timing line at the V4-Flash expert shapes
// against one cuBLASLt GEMM per expert (information, never pass/fail).
#include <gtest/gtest.h>

#include <numeric>

#include "cuda_test_util.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/linear.h"

namespace cpfill {
namespace {

using test_cuda::random_bf16;

struct GroupedCase {
    std::vector<int32_t> counts;  // rows per expert
    int64_t in, out;
};

class CudaGroupedGemm : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(CudaGroupedGemm, MatchesCpuPerExpert) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto& [counts, in, out] = GetParam();
    const int E = static_cast<int>(counts.size());
    const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    auto x = random_bf16(rows * in, 11), w = random_bf16(E * out * in, 12, 0.05f);
    std::vector<float> ref(rows * out);
    int64_t first = 0;
    for (int e = 0; e < E; ++e) {
        ops::linear(x.data() + first * in, counts[e], in, w.data() + e * out * in, out,
                    ref.data() + first * out);
        first += counts[e];
    }
    auto dx = cuda::upload_bf16(x.data(), x.size()), dw = cuda::upload_bf16(w.data(), w.size());
    auto dcounts = test_cuda::upload(counts);
    cuda::DeviceBuffer dy(std::max<int64_t>(rows, 1) * out * 2);
    CPFILL_CUDA_CHECK(cudaMemset(dy.as<void>(), 0xff, rows * out * 2));  // NaN where unwritten
    ops::cuda::GroupedGemm g(64);
    g.experts(dcounts.as<int32_t>(), counts.data(), E, dx.as<__nv_bfloat16>(), in,
              dw.as<__nv_bfloat16>(), out, dy.as<__nv_bfloat16>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto d =
        test_cuda::print_diff("y", test_cuda::diff(cuda::download_bf16(dy, rows * out), ref));
    EXPECT_LE(d.rel, 1e-2) << d.str();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGroupedGemm,
                         ::testing::Values(GroupedCase{{5, 0, 17, 1, 0, 33, 2}, 48, 64},
                                           GroupedCase{{1}, 96, 40},
                                           GroupedCase{{0, 0, 9}, 64, 128},
                                           GroupedCase{{130, 7, 0, 64, 3, 1, 250, 12}, 256, 72},
                                           GroupedCase{{300, 0, 1, 29}, 40, 512}));

TEST(CudaGroupedGemm, AllExpertsEmptyWritesNothing) {
    CPFILL_SKIP_WITHOUT_GPU();
    const std::vector<int32_t> counts{0, 0, 0};
    auto dcounts = test_cuda::upload(counts);
    ops::cuda::GroupedGemm g(8);
    g.experts(dcounts.as<int32_t>(), counts.data(), 3, nullptr, 64, nullptr, 64, nullptr, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaGroupedGemm, TooManyExpertsIsAnError) {
    CPFILL_SKIP_WITHOUT_GPU();
    const std::vector<int32_t> counts(9, 1);
    ops::cuda::GroupedGemm g(8);
    EXPECT_THROW(g.experts(nullptr, counts.data(), 9, nullptr, 64, nullptr, 64, nullptr, nullptr),
                 Error);
}

// V4-Flash at 64k tokens, CP = 2: 256 experts × ~1,536 rows; gate_up 4096 → 2 · 1024, down
// 1024 → 4096 (each rank's half of the expert width).
TEST(CudaGroupedGemmTiming, FlashExperts) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int E = 256;
    std::vector<int32_t> counts(E);
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> jitter(-300, 300);
    for (auto& c : counts) c = 1536 + jitter(rng);
    const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{4096, 2048}, {1024, 4096}}) {
        cuda::DeviceBuffer dx(rows * in * 2), dw(E * out * in * 2), dy(rows * out * 2);
        CPFILL_CUDA_CHECK(cudaMemset(dx.as<void>(), 0, rows * in * 2));
        CPFILL_CUDA_CHECK(cudaMemset(dw.as<void>(), 0, E * out * in * 2));
        auto dcounts = test_cuda::upload(counts);
        ops::cuda::GroupedGemm g(E);
        ops::cuda::GemmContext ctx;
        const auto* x = dx.as<__nv_bfloat16>();
        const auto* w = dw.as<__nv_bfloat16>();
        auto* y = dy.as<__nv_bfloat16>();
        const double grouped = test_cuda::time_ms(
            [&] { g.experts(dcounts.as<int32_t>(), counts.data(), E, x, in, w, out, y, nullptr); });
        const double looped = test_cuda::time_ms([&] {
            int64_t first = 0;
            for (int e = 0; e < E; ++e) {
                ops::cuda::linear_bf16(ctx, x + first * in, counts[e], in, w + e * out * in, out,
                                       y + first * out, nullptr, false, nullptr);
                first += counts[e];
            }
        });
        const double tflop = 2.0 * rows * in * out * 1e-12;
        std::printf(
            "[ timing ] %d experts, %lld rows, %lld -> %lld: grouped %.3f ms (%.0f TFLOP/s), "
            "one GEMM per expert %.3f ms (%.0f TFLOP/s)\n",
            E, static_cast<long long>(rows), static_cast<long long>(in),
            static_cast<long long>(out), grouped, tflop / grouped * 1e3, looped,
            tflop / looped * 1e3);
    }
}

}  // namespace
}  // namespace cpfill
