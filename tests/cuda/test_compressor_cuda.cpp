// Compressor pooling on the GPU against ops/compressor.h: HCA (ratio 128) and CSA (ratio 4,
// overlap) windows, a window range that starts late (rows start mid-request), channel counts that
// are not multiples of the 128-thread block, and packed rows (kv and gate side by side, odd
// stride). The output is bf16: tolerance 1e-2 of the tensor's scale.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/compressor.h"
#include "ops/cuda/compressor.h"

namespace cpfill {
namespace {

using namespace test_cuda;

struct PoolCase {
    int ratio;
    int64_t dim;
    bool overlap;
    int64_t w_begin, w_end;
    int64_t pad;  // extra columns per packed row
};

class CudaCompressor : public ::testing::TestWithParam<PoolCase> {};

TEST_P(CudaCompressor, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const PoolCase c = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "ratio " << c.ratio << ", dim " << c.dim << ", overlap " << c.overlap
                 << ", windows [" << c.w_begin << ", " << c.w_end << "), seeds 50-52");
    const int64_t width = c.overlap ? 2 * c.dim : c.dim;
    const int64_t row0 = std::max<int64_t>(0, (c.w_begin - (c.overlap ? 1 : 0)) * c.ratio);
    const int64_t n_rows = c.w_end * c.ratio - row0;
    auto kv = random_bf16(n_rows * width, 50);
    auto gate = random_bf16(n_rows * width, 51, 2.0f);
    auto bias = random_f32(c.ratio * width, 52);
    std::vector<float> ref((c.w_end - c.w_begin) * c.dim);
    ops::compress_pool({c.ratio, c.dim, c.overlap}, kv.data(), gate.data(), row0, bias.data(),
                       c.w_begin, c.w_end, ref.data());

    // Packed device rows: [kv | gate | pad].
    const int64_t ld = 2 * width + c.pad;
    std::vector<float> packed(n_rows * ld, 0.0f);
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < width; ++i) {
            packed[r * ld + i] = kv[r * width + i];
            packed[r * ld + width + i] = gate[r * width + i];
        }
    auto dpacked = cuda::upload_bf16(packed.data(), packed.size());
    auto dbias = upload(bias);
    cuda::DeviceBuffer dout(ref.size() * 2);
    const __nv_bfloat16* base = dpacked.as<__nv_bfloat16>();
    ops::cuda::compress_pool({c.ratio, c.dim, c.overlap}, base, base + width, ld, row0,
                             dbias.as<float>(), c.w_begin, c.w_end, dout.as<__nv_bfloat16>(),
                             nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff d = print_diff("out", diff(cuda::download_bf16(dout, ref.size()), ref));
    EXPECT_LE(d.rel, 1e-2) << d.str();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaCompressor,
    ::testing::Values(PoolCase{128, 512, false, 0, 1, 0},    // HCA, one window
                      PoolCase{128, 512, false, 0, 3, 5},    // HCA, packed odd stride
                      PoolCase{128, 100, false, 2, 4, 0},    // HCA, late start, odd dim
                      PoolCase{4, 512, true, 0, 9, 0},       // CSA main, window 0 has no Ca
                      PoolCase{4, 128, true, 0, 250, 3},     // CSA indexer keys
                      PoolCase{4, 512, true, 7, 20, 0},      // CSA, rows start at window 6
                      PoolCase{4, 33, true, 1, 2, 1},        // one window, tiny dim
                      PoolCase{1, 7, false, 0, 5, 0},        // ratio 1
                      PoolCase{4, 512, true, 0, 2048, 0}));  // 8192 tokens

}  // namespace
}  // namespace cpfill
