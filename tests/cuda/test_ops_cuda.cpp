// CUDA ops against the CPU backend's ops over a grid of awkward shapes (label `cuda`). Inputs are
// rounded to bf16 first so both sides see the same values; tolerances: bf16 outputs 1e-2 relative
// to the tensor's scale, fp32 outputs 1e-4 (same products, different summation order). Skips with
// the reason when no GPU is present.
#include <gtest/gtest.h>

#include <random>

#include "core/dtype.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rope.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "runtime/cuda/buffer.h"
#include "runtime/device.h"

namespace cpfill {
namespace {

#define SKIP_WITHOUT_GPU()                                     \
    do {                                                       \
        std::string why;                                       \
        if (cuda_device_count(&why) == 0) GTEST_SKIP() << why; \
    } while (0)

std::vector<float> random_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0, ref = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        m = std::max(m, double(std::abs(a[i] - b[i])));
        ref = std::max(ref, double(std::abs(b[i])));
    }
    return ref > 0 ? m / ref : m;
}

struct GemmShape {
    int64_t n, in, out;
};

class CudaGemm : public ::testing::TestWithParam<GemmShape> {};

TEST_P(CudaGemm, MatchesCpu) {
    SKIP_WITHOUT_GPU();
    const auto [n, in, out] = GetParam();
    auto x = random_bf16(n * in, 1), w = random_bf16(out * in, 2, 0.05f);
    std::vector<float> ref(n * out);
    ops::linear(x.data(), n, in, w.data(), out, ref.data());
    auto dx = cuda::upload_bf16(x.data(), x.size()), dw = cuda::upload_bf16(w.data(), w.size());
    cuda::DeviceBuffer y32(n * out * 4), y16(n * out * 2);
    ops::cuda::GemmContext ctx;
    ops::cuda::linear_bf16(ctx, dx.as<__nv_bfloat16>(), n, in, dw.as<__nv_bfloat16>(), out, nullptr,
                           y32.as<float>(), false, nullptr);
    ops::cuda::linear_bf16(ctx, dx.as<__nv_bfloat16>(), n, in, dw.as<__nv_bfloat16>(), out,
                           y16.as<__nv_bfloat16>(), nullptr, false, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(cuda::download_f32(y32, n * out), ref), 1e-4);
    EXPECT_LE(rel_err(cuda::download_bf16(y16, n * out), ref), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm,
                         ::testing::Values(GemmShape{1, 64, 1}, GemmShape{7, 96, 130},
                                           GemmShape{133, 512, 1000}, GemmShape{300, 1024, 257},
                                           GemmShape{1000, 4096, 512}));

// Row counts of one plan class (ops/gemm_plan_rows.h: 257–320, 1281–1536) and around its edges, in
// one context, largest first and smallest first: each result equals the CPU's, so the plan's
// layouts follow the row count (a plan kept at the first n would compute the wrong rows).
TEST(CudaGemm, RowCountsSharingAPlanEachMatchCpu) {
    SKIP_WITHOUT_GPU();
    const int64_t in = 256, out = 384;
    const auto w = random_bf16(out * in, 9, 0.05f);
    const auto dw = cuda::upload_bf16(w.data(), w.size());
    ops::cuda::GemmContext ctx;
    for (const std::vector<int64_t>& ns : {std::vector<int64_t>{320, 257, 300, 256, 321},
                                           std::vector<int64_t>{1281, 1536, 1400, 1537}}) {
        for (const int64_t n : ns) {
            const auto x = random_bf16(n * in, 10 + n);
            std::vector<float> ref(n * out);
            ops::linear(x.data(), n, in, w.data(), out, ref.data());
            const auto dx = cuda::upload_bf16(x.data(), x.size());
            cuda::DeviceBuffer y(n * out * 4);
            ops::cuda::linear_bf16(ctx, dx.as<__nv_bfloat16>(), n, in, dw.as<__nv_bfloat16>(), out,
                                   nullptr, y.as<float>(), false, nullptr);
            CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_LE(rel_err(cuda::download_f32(y, n * out), ref), 1e-4) << "n " << n;
        }
    }
}

class CudaRmsnorm : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(CudaRmsnorm, MatchesCpu) {
    SKIP_WITHOUT_GPU();
    const auto [rows, n] = GetParam();
    auto x = random_bf16(rows * n, 3, 2.0f), w = random_bf16(n, 4);
    for (bool weighted : {false, true}) {
        std::vector<float> ref(rows * n);
        ops::rmsnorm(x.data(), rows, n, weighted ? w.data() : nullptr, 1e-6f, ref.data());
        auto dx = cuda::upload_bf16(x.data(), x.size());
        auto dw = cuda::upload_f32(w.data(), w.size());
        cuda::DeviceBuffer y(rows * n * 2);
        ops::cuda::rmsnorm(dx.as<__nv_bfloat16>(), rows, n, weighted ? dw.as<float>() : nullptr,
                           1e-6f, y.as<__nv_bfloat16>(), nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_LE(rel_err(cuda::download_bf16(y, rows * n), ref), 1e-2) << "weighted " << weighted;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaRmsnorm,
                         ::testing::Values(std::pair<int64_t, int64_t>{1, 1}, std::pair{3, 48},
                                           std::pair{17, 512}, std::pair{5, 16384},
                                           std::pair{1000, 1024}, std::pair{9, 128},
                                           std::pair{9, 256}, std::pair{4, 2048}));

// rmsnorm_rope against the CPU's rmsnorm then apply_rope, per head block, on rows of a wider
// stride written to a separate output of another stride; widths with the warp-per-block kernel
// (128, 512) and without it (96).
TEST(CudaRmsnormRope, MatchesCpuNormThenRope) {
    SKIP_WITHOUT_GPU();
    const int64_t rows = 29;
    const int heads = 3, rope_dim = 64;
    ops::RopeTable table(RopeParams{}, rope_dim);
    auto dfreq = cuda::upload_f32(table.inv_freq().data(), table.inv_freq().size());
    std::vector<int64_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = i * 977 % 70000;
    cuda::DeviceBuffer dpos(rows * 8);
    CPFILL_CUDA_CHECK(cudaMemcpy(dpos.as<void>(), pos.data(), rows * 8, cudaMemcpyHostToDevice));
    for (const int head_dim : {512, 128, 96}) {
        const int64_t width = int64_t{heads} * head_dim, ldx = width + 8, ldy = width + 4;
        auto x = random_bf16(rows * ldx, 21 + head_dim, 3.0f), w = random_bf16(head_dim, 22);
        for (const bool weighted : {false, true}) {
            std::vector<float> ref(rows * width);
            for (int64_t r = 0; r < rows; ++r)
                ops::rmsnorm(x.data() + r * ldx, heads, head_dim, weighted ? w.data() : nullptr,
                             1e-6f, ref.data() + r * width);
            ops::apply_rope(table, ref.data(), rows, width, heads, head_dim, pos.data(), false);
            auto dx = cuda::upload_bf16(x.data(), x.size());
            auto dw = cuda::upload_f32(w.data(), w.size());
            cuda::DeviceBuffer dy(rows * ldy * 2);
            ops::cuda::NormRope p;
            p.heads = heads;
            p.head_dim = head_dim;
            p.w = weighted ? dw.as<float>() : nullptr;
            p.rope_dim = rope_dim;
            p.inv_freq = dfreq.as<float>();
            p.pos = dpos.as<int64_t>();
            ops::cuda::rmsnorm_rope(dx.as<__nv_bfloat16>(), ldx, dy.as<__nv_bfloat16>(), ldy, rows,
                                    p, nullptr);
            CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> y = cuda::download_bf16(dy, rows * ldy);
            std::vector<float> got(rows * width);
            for (int64_t r = 0; r < rows; ++r)
                std::copy_n(y.begin() + r * ldy, width, got.begin() + r * width);
            EXPECT_LE(rel_err(got, ref), 1e-2)
                << "head_dim " << head_dim << ", weighted " << weighted;
        }
    }
}

TEST(CudaRope, MatchesCpuPlainAndYarn) {
    SKIP_WITHOUT_GPU();
    const int64_t rows = 37;
    const int heads = 3, head_dim = 512, rope_dim = 64;
    RopeParams plain;
    RopeParams yarn;
    yarn.theta = 160000;
    yarn.yarn = true;
    yarn.factor = 16;
    for (const RopeParams& p : {plain, yarn}) {
        ops::RopeTable table(p, rope_dim);
        auto x = random_bf16(rows * heads * head_dim, 5);
        std::vector<int64_t> pos(rows);
        for (int64_t i = 0; i < rows; ++i) pos[i] = i * 2711 % 100000;
        auto dx = cuda::upload_bf16(x.data(), x.size());
        auto dfreq = cuda::upload_f32(table.inv_freq().data(), table.inv_freq().size());
        cuda::DeviceBuffer dpos(rows * 8);
        CPFILL_CUDA_CHECK(
            cudaMemcpy(dpos.as<void>(), pos.data(), rows * 8, cudaMemcpyHostToDevice));
        for (bool inverse : {false, true}) {
            std::vector<float> ref = x;
            ops::apply_rope(table, ref.data(), rows, heads * head_dim, heads, head_dim, pos.data(),
                            inverse);
            auto dy = cuda::upload_bf16(x.data(), x.size());
            ops::cuda::apply_rope(dy.as<__nv_bfloat16>(), rows, heads * head_dim, heads, head_dim,
                                  rope_dim, dfreq.as<float>(), dpos.as<int64_t>(), inverse,
                                  nullptr);
            CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_LE(rel_err(cuda::download_bf16(dy, x.size()), ref), 1e-2);
        }
    }
}

TEST(CudaDevice, ReportsTheGpu) {
    SKIP_WITHOUT_GPU();
    CudaDeviceInfo info = cuda_device_info(0);
    EXPECT_GT(info.sm_count, 0);
    EXPECT_GT(info.total_bytes, 0u);
    std::printf("[ device ] %s, %d SMs, cc %d.%d, %.1f GiB\n", info.name.c_str(), info.sm_count,
                info.major, info.minor, info.total_bytes / double(1ull << 30));
}

}  // namespace
}  // namespace cpfill
