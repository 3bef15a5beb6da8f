// fp8_linear (ops/cuda/fp8_linear.h) by cuBLASLt's block-scaled GEMM and by cpfill's grouped fp8
// kernel as one expert (CPFILL_FP8_GEMM=cpfill): both equal the fp64 product of the dequantised
// inputs to bf16 rounding of each output, on row counts with and without a 4-row tail, output
// widths of whole and half 256-wide tiles, and outputs written with a row stride wider than the
// output (the packed rows of the attention), whose columns in between stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

struct LinearCase {
    int64_t n, in, out, ldy;
};

class Fp8LinearGemms : public ::testing::TestWithParam<LinearCase> {};

TEST_P(Fp8LinearGemms, BothEqualTheProductOfTheDequantisedInputs) {
    CPFILL_SKIP_WITHOUT_SM90();
    const LinearCase p = GetParam();
    const oc::Fp8Blocks tiles = oc::Fp8Blocks::Tile128;
    // Weights: each 128×128 tile at its own power of two; activations: each token and 128
    // channels at its own, so a scale read from the wrong place is off by orders of magnitude.
    std::vector<float> w = test_cuda::random_f32(static_cast<size_t>(p.out * p.in), 3);
    for (int64_t o = 0; o < p.out; ++o)
        for (int64_t k = 0; k < p.in; ++k)
            w[o * p.in + k] *=
                std::ldexp(1.0f, static_cast<int>(((o / 128) * 3 + (k / 128) * 5) % 9) - 4);
    std::vector<float> x = test_cuda::random_bf16(static_cast<size_t>(p.n * p.in), 5);
    std::vector<uint16_t> xb(x.size());
    for (int64_t t = 0; t < p.n; ++t)
        for (int64_t k = 0; k < p.in; ++k) {
            const size_t i = static_cast<size_t>(t * p.in + k);
            x[i] *= std::ldexp(1.0f, static_cast<int>((t % 5 + (k / 128) * 2) % 7) - 3);
            xb[i] = f32_to_bf16(x[i]);
        }
    const cuda::DeviceBuffer dw = upload(w), dx = upload(xb);
    cuda::DeviceBuffer wq(p.out * p.in), ws(oc::fp8_weight_scales(p.out, p.in, tiles) * 4),
        wback(p.out * p.in * 4);
    oc::quantize_weight_fp8(dw.as<float>(), p.out, p.in, tiles, wq.as<void>(), ws.as<float>(),
                            nullptr, nullptr);
    oc::dequantize_weight_fp8(wq.as<void>(), ws.as<float>(), p.out, p.in, tiles, wback.as<float>(),
                              nullptr);
    // The activations as the linear quantises them (the host's rounding: test_fp8_cuda.cpp).
    const int64_t n4 = (p.n + 3) / 4 * 4;
    cuda::DeviceBuffer xq(n4 * p.in), xs(n4 * (p.in / 128) * 4), xback(n4 * p.in * 4);
    oc::quantize_act_fp8(dx.as<__nv_bfloat16>(), p.in, p.n, p.in, xq.as<void>(), xs.as<float>(),
                         nullptr, n4);
    oc::dequantize_weight_fp8(xq.as<void>(), xs.as<float>(), n4, p.in, oc::Fp8Blocks::Row128,
                              xback.as<float>(), nullptr);
    oc::Fp8LinearScratch s;
    cuda::DeviceBuffer q(p.n * p.in), sc(p.n * p.in / 128 * 4), tq(4 * p.in),
        tsc(4 * p.in / 128 * 4), ty(4 * p.out * 4);
    s.q = q.as<void>();
    s.scale = sc.as<float>();
    s.tail_q = tq.as<void>();
    s.tail_scale = tsc.as<float>();
    s.tail_y = ty.as<float>();
    s.capacity = p.n * p.in;
    s.cols = p.in;
    s.out = p.out;
    const std::vector<float> wd = download<float>(wback, static_cast<size_t>(p.out * p.in));
    const std::vector<float> xd = download<float>(xback, static_cast<size_t>(n4 * p.in));
    oc::GemmContext ctx;
    const uint16_t sentinel = f32_to_bf16(1234.0f);
    for (oc::Fp8DenseGemm g : {oc::Fp8DenseGemm::Cublas, oc::Fp8DenseGemm::Cpfill}) {
        // A row stride of other than 16 bytes' multiples: cuBLASLt's layouts want 16-byte rows,
        // so only the grouped kernel's register epilogue is tried there.
        if (g == oc::Fp8DenseGemm::Cublas && p.ldy % 8 != 0) continue;
        std::vector<uint16_t> init(static_cast<size_t>(p.n * p.ldy), sentinel);
        cuda::DeviceBuffer y = upload(init);
        EXPECT_EQ(oc::fp8_linear_grouped(g, tiles, p.in, p.out, y.as<__nv_bfloat16>(), p.ldy),
                  g == oc::Fp8DenseGemm::Cpfill);
        oc::fp8_linear(ctx, s, dx.as<__nv_bfloat16>(), p.in, p.n, p.in, wq.as<void>(),
                       ws.as<float>(), tiles, p.out, y.as<__nv_bfloat16>(), nullptr, p.ldy, nullptr,
                       g);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> yb = download<uint16_t>(y, static_cast<size_t>(p.n * p.ldy));
        double worst = 0;
        int64_t worst_at = 0;
        for (int64_t t = 0; t < p.n; ++t) {
            for (int64_t o = 0; o < p.out; ++o) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < p.in; ++k) {
                    const double a = xd[t * p.in + k], b = wd[o * p.in + k];
                    ref += a * b;
                    mag += std::abs(a * b);
                }
                const double err = std::abs(bf16_to_f32(yb[t * p.ldy + o]) - ref) / (mag + 1e-30);
                if (err > worst) {
                    worst = err;
                    worst_at = t * p.ldy + o;
                }
            }
            for (int64_t o = p.out; o < p.ldy; ++o)
                ASSERT_EQ(yb[t * p.ldy + o], sentinel)
                    << oc::fp8_dense_gemm_name(g) << ": wrote row " << t << " column " << o;
        }
        std::printf("[ fp8 linear ] %s, %lld × %lld → %lld (stride %lld): worst %.3g of Σ|x·w|\n",
                    oc::fp8_dense_gemm_name(g), static_cast<long long>(p.n),
                    static_cast<long long>(p.in), static_cast<long long>(p.out),
                    static_cast<long long>(p.ldy), worst);
        EXPECT_LT(worst, 4e-3) << oc::fp8_dense_gemm_name(g) << " at " << worst_at;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8LinearGemms,
                         ::testing::Values(LinearCase{36, 256, 384, 384},     // a half tile
                                           LinearCase{300, 512, 256, 256},    // partial row tiles
                                           LinearCase{1027, 1024, 512, 512},  // a 3-row tail
                                           LinearCase{130, 384, 640, 704},    // strided output
                                           LinearCase{64, 256, 128,
                                                      130}));  // the register epilogue

TEST(Fp8LinearGemms, UnknownChoiceIsAnError) {
    EXPECT_EQ(oc::parse_fp8_dense_gemm(nullptr), oc::Fp8DenseGemm::Cublas);
    EXPECT_EQ(oc::parse_fp8_dense_gemm("cpfill"), oc::Fp8DenseGemm::Cpfill);
    try {
        (void)oc::parse_fp8_dense_gemm("deepgemm");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected cublas (the default) or cpfill"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace cpfill
