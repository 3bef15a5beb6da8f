// The GPU attention (attention_tc) against ops/attention.h at the edge positions: sliding (window
// only), HCA (all eligible entries) and CSA (chosen entries with −1 padding) key lists, 1 to 128
// heads (partial head groups), queries at the edges of the window and of the compressed windows,
// sinks that dominate. bf16 output: tolerance 1e-2 of the tensor's scale. The grid of shapes is in
// test_attention_tc_cuda.cpp; the kernel's rate: bench/kernel_bench.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention_test_data.h"
#include "cuda_test_util.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"

namespace cpfill {
namespace {

using namespace test_cuda;
using namespace test_cuda::attention;

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const AttnCase c = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "heads " << c.n_heads << ", tokens " << c.n_tokens << ", ratio " << c.ratio
                 << ", top_k " << c.top_k << ", seeds 60-64");
    AttnData d = make_data(c, 60);
    std::vector<float> ref = cpu_attention(c, d);
    DeviceAttn dev(c, d);
    ops::cuda::attention_tc(dev.args, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff diffs = print_diff("out", diff(cuda::download_bf16(dev.out, ref.size()), ref));
    EXPECT_LE(diffs.rel, 1e-2) << diffs.str();
}

std::vector<int64_t> positions(std::initializer_list<int64_t> p) { return p; }

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAttention,
    ::testing::Values(
        // sliding: the first keys, the window edge
        AttnCase{5, 200, 0, 0, 1.0f, positions({0, 1, 2, 63, 64, 126, 127, 128, 129, 199})},
        // HCA: before, at and after the first complete 128-token window
        AttnCase{16, 300, 128, 0, 1.0f, positions({0, 126, 127, 128, 255, 256, 299})},
        // CSA: fewer eligible entries than top_k (−1 padding), then sparse
        AttnCase{64, 600, 4, 64, 1.0f, positions({0, 3, 4, 7, 100, 255, 256, 257, 599})},
        // one head; sinks far above and below the logits
        AttnCase{1, 130, 4, 7, 60.0f, positions({0, 5, 64, 129})},
        AttnCase{3, 130, 128, 0, 60.0f, positions({127, 128, 129})},
        // V4-Pro head count (8 groups), V4-Flash-like top-k on a longer store
        AttnCase{128, 2100, 4, 512, 1.0f, positions({2099, 2050, 1000, 17})},
        AttnCase{24, 1500, 128, 0, 1.0f, positions({1499, 1407, 1408, 640})}));

}  // namespace
}  // namespace cpfill
