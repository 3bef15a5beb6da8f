// The grouped fp8 expert GEMM (ops/cuda/grouped_fp8.h) against the fp64 product of its dequantised
// inputs on the host. Inputs are e4m3 bytes with a power-of-two scale per (row, 128 columns) of x
// and per 128 × 128 tile of w, each block at its own magnitude (2^-6 … 2^6), so a scale read from
// the wrong block is off by orders of magnitude; expert sizes include 0, 4 and row tiles cut short,
// more tiles than multiprocessors and more k-blocks than pipeline stages.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/grouped_fp8.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/fp8_blocks.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

uint8_t random_e4m3(std::mt19937_64& rng) {
    for (;;) {  // any finite byte (0x7f, 0xff are NaN)
        const auto b = static_cast<uint8_t>(rng() & 0xff);
        if ((b & 0x7f) != 0x7f) return b;
    }
}

struct Case {
    std::vector<int> counts;  // rows per expert
    int64_t in, out;
};

void run_case(const Case& c, uint64_t seed) {
    const int E = static_cast<int>(c.counts.size());
    const int64_t K = c.in, N = c.out, kb_n = K / 128;
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> mag(-6, 6);
    std::vector<int32_t> pfirst(E + 1, 0);
    for (int e = 0; e < E; ++e) pfirst[e + 1] = pfirst[e] + int32_t(oc::padded_rows(c.counts[e]));
    const int64_t n_pad = pfirst[E];
    // x: e4m3 rows; pad rows zeros with scale 1 (as gather_quant_fp8 writes them).
    std::vector<uint8_t> xq(n_pad * K, 0);
    std::vector<float> xs(n_pad * kb_n, 1.0f);
    for (int e = 0; e < E; ++e) {
        const int64_t m4 = pfirst[e + 1] - pfirst[e];
        for (int64_t i = 0; i < c.counts[e]; ++i) {
            const int64_t p = pfirst[e] + i;
            for (int64_t k = 0; k < K; ++k) xq[p * K + k] = random_e4m3(rng);
            for (int64_t kb = 0; kb < kb_n; ++kb)
                xs[pfirst[e] * kb_n + kb * m4 + i] = std::ldexp(1.0f, mag(rng));
        }
    }
    const int64_t spm = ops::fp8_scale_count(N, K, ops::Fp8Blocks::Tile128),
                  ws_ld = spm / (N / 128);
    std::vector<uint8_t> wq(E * N * K);
    std::vector<float> ws(E * spm, 1.0f);
    for (auto& b : wq) b = random_e4m3(rng);
    for (int e = 0; e < E; ++e)
        for (int64_t nt = 0; nt < N / 128; ++nt)
            for (int64_t kb = 0; kb < kb_n; ++kb)
                ws[e * spm + nt * ws_ld + kb] = std::ldexp(1.0f, mag(rng));
    const cuda::DeviceBuffer dxq = upload(xq), dxs = upload(xs), dwq = upload(wq), dws = upload(ws),
                             dpf = upload(pfirst);
    // Two sentinel rows after the last padded row must stay as they are.
    const std::vector<uint16_t> init((n_pad + 2) * N, f32_to_bf16(-7.0f));
    cuda::DeviceBuffer dy = upload(init);
    oc::GroupedFp8Gemm g;
    g.x = dxq.as<void>();
    g.xs = dxs.as<float>();
    g.n_pad = n_pad;
    g.pfirst = dpf.as<int32_t>();
    g.n_experts = E;
    g.w = dwq.as<void>();
    g.ws = dws.as<float>();
    g.ws_per_expert = spm;
    g.in = K;
    g.out = N;
    g.y = dy.as<__nv_bfloat16>();
    oc::grouped_gemm_fp8(g, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y = download<uint16_t>(dy, init.size());
    std::vector<float> xf(xq.size()), wf(wq.size());
    for (size_t i = 0; i < xq.size(); ++i) xf[i] = e4m3_to_f32(xq[i]);
    for (size_t i = 0; i < wq.size(); ++i) wf[i] = e4m3_to_f32(wq[i]);
    double worst = 0;
    int64_t checked = 0;
    for (int e = 0; e < E; ++e) {
        const int64_t m4 = pfirst[e + 1] - pfirst[e];
        for (int64_t i = 0; i < m4; ++i) {
            const int64_t p = pfirst[e] + i;
            for (int64_t o = 0; o < N; o += (i % 5 == 0 ? 1 : 7)) {
                double sum = 0, mag_sum = 0;
                for (int64_t kb = 0; kb < kb_n; ++kb) {
                    const double s = double(xs[pfirst[e] * kb_n + kb * m4 + i]) *
                                     ws[e * spm + (o / 128) * ws_ld + kb];
                    double part = 0, part_abs = 0;
                    for (int64_t k = kb * 128; k < kb * 128 + 128; ++k) {
                        const double v = double(xf[p * K + k]) * wf[(e * N + o) * K + k];
                        part += v;
                        part_abs += std::abs(v);
                    }
                    sum += part * s;
                    mag_sum += part_abs * s;
                }
                const double got = bf16_to_f32(y[p * N + o]);
                // fp32 accumulation inside a 128-block (the tensor cores keep fewer bits: 2.4e-4
                // of Σ|x·w| measured for cuBLASLt) plus the bf16 rounding of the output.
                const double tol = 1e-3 * mag_sum + std::abs(sum) / 256 + 1e-30;
                const double err = std::abs(got - sum);
                worst = std::max(worst, err / tol);
                ++checked;
                ASSERT_LE(err, tol) << "expert " << e << " row " << i << " column " << o << ": got "
                                    << got << ", want " << sum << " (Σ|x·w| " << mag_sum << ")";
            }
        }
    }
    for (int64_t p = n_pad; p < n_pad + 2; ++p)
        for (int64_t o = 0; o < N; ++o)
            ASSERT_EQ(y[p * N + o], init[0]) << "row " << p << " after the last was written";
    std::printf("[ info ] %lld outputs checked, worst error %.3f of the tolerance\n",
                static_cast<long long>(checked), worst);
}

TEST(GroupedFp8, SmallExpertsAndEmptyOnes) {
    CPFILL_SKIP_WITHOUT_GPU();
    if (!oc::grouped_fp8_supported()) GTEST_SKIP() << "needs compute capability 9.0";
    run_case({{0, 3, 130, 0, 257, 1, 4}, 256, 384}, 1);
}

// 200 output tiles (more than the multiprocessors) and 8 k-blocks (more than the stages).
TEST(GroupedFp8, MoreTilesThanMultiprocessorsAndLongK) {
    CPFILL_SKIP_WITHOUT_GPU();
    if (!oc::grouped_fp8_supported()) GTEST_SKIP() << "needs compute capability 9.0";
    run_case({{1200, 517, 0, 1280}, 1024, 2048}, 2);
}

TEST(GroupedFp8, RefusesWidthsOffTheBlocks) {
    CPFILL_SKIP_WITHOUT_GPU();
    oc::GroupedFp8Gemm g;
    g.n_experts = 1;
    g.in = 200;
    g.out = 128;
    g.n_pad = 4;
    EXPECT_THROW(oc::grouped_gemm_fp8(g, nullptr), Error);
}

}  // namespace
}  // namespace cpfill
