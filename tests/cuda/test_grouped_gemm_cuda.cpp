// GroupedGemm (cublasGemmGroupedBatchedEx over the routed experts) against the CPU linear per
// expert, with empty experts and awkward sizes. Its rate at the V4-Flash expert shapes against one
// cuBLASLt GEMM per expert: bench/kernel_bench.cpp.
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
    // Null operands: a launch that touched them would fault and fail the synchronisation.
    g.experts(dcounts.as<int32_t>(), counts.data(), 3, nullptr, 64, nullptr, 64, nullptr, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Real operands: the output keeps its sentinel bytes.
    auto x = random_bf16(4 * 64, 13), w = random_bf16(3 * 64 * 64, 14);
    auto dx = cuda::upload_bf16(x.data(), x.size()), dw = cuda::upload_bf16(w.data(), w.size());
    cuda::DeviceBuffer dy(4 * 64 * 2);
    CPFILL_CUDA_CHECK(cudaMemset(dy.as<void>(), 0xab, dy.bytes()));
    g.experts(dcounts.as<int32_t>(), counts.data(), 3, dx.as<__nv_bfloat16>(), 64,
              dw.as<__nv_bfloat16>(), 64, dy.as<__nv_bfloat16>(), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = test_cuda::download<uint8_t>(dy, dy.bytes());
    EXPECT_EQ(std::count(y.begin(), y.end(), uint8_t{0xab}), static_cast<int64_t>(y.size()));
}

TEST(CudaGroupedGemm, TooManyExpertsIsAnError) {
    CPFILL_SKIP_WITHOUT_GPU();
    const std::vector<int32_t> counts(9, 1);
    ops::cuda::GroupedGemm g(8);
    EXPECT_THROW(g.experts(nullptr, counts.data(), 9, nullptr, 64, nullptr, 64, nullptr, nullptr),
                 Error);
}

}  // namespace
}  // namespace cpfill
