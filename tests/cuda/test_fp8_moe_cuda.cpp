// The fp8 activation paths of the GPU model: fp8_linear for any row count (the 4-row tail), and the
// routed experts' padded fp8 rows (ops/cuda/moe_fp8.h): gather by expert with quantisation,
// SwiGLU with quantisation. Each against a host computation of the same thing.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/moe_fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    return b;
}

// e4m3 rounding of one value of a block with scale s: half a step (2^-4 relative for normals,
// 2^-10 · s for subnormals).
void expect_quantised(float got, float want, float s, const char* what, size_t at) {
    ASSERT_LE(std::abs(got - want), std::abs(want) / 16 + s / 1024 * 1.01f) << what << " " << at;
}

// 37 rows (a body of 36 and a tail of 1), output rows strided, beside 40 rows padded by hand.
TEST(Fp8Linear, AnyRowCountEqualsThePaddedGemm) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int64_t n = 37, in = 256, out = 200, ldy = out + 8, pad = 40;
    const std::vector<float> w = test_cuda::random_f32(out * in, 3, 0.1f);
    const std::vector<uint16_t> xb = to_bf16(test_cuda::random_f32(n * in, 4));
    const cuda::DeviceBuffer dw = upload(w), dx = upload(xb);
    cuda::DeviceBuffer wq(out * in), ws(oc::fp8_weight_scales(out, in, oc::Fp8Blocks::Tile128) * 4);
    oc::quantize_weight_fp8(dw.as<float>(), out, in, oc::Fp8Blocks::Tile128, wq.as<void>(),
                            ws.as<float>(), nullptr, nullptr);
    cuda::DeviceBuffer q(pad * in), s(pad * in / 128 * 4), tq(4 * in), ts(4 * in / 128 * 4),
        ty(4 * out * 4);
    oc::Fp8LinearScratch sc{
        q.as<void>(), s.as<float>(), tq.as<void>(), ts.as<float>(), ty.as<float>(), pad * in, in,
        out};
    // Sentinels around the output: the gap columns and the rows after n must stay as they are.
    std::vector<float> init((n + 3) * ldy, -7.0f);
    cuda::DeviceBuffer y32 = upload(init), yb(pad * out * 2), ref(pad * out * 2);
    oc::GemmContext ctx;
    oc::fp8_linear(ctx, sc, dx.as<__nv_bfloat16>(), in, n, in, wq.as<void>(), ws.as<float>(),
                   oc::Fp8Blocks::Tile128, out, nullptr, y32.as<float>(), ldy, nullptr);
    oc::fp8_linear(ctx, sc, dx.as<__nv_bfloat16>(), in, n, in, wq.as<void>(), ws.as<float>(),
                   oc::Fp8Blocks::Tile128, out, yb.as<__nv_bfloat16>(), nullptr, out, nullptr);
    cuda::DeviceBuffer rq(pad * in), rs(pad * in / 128 * 4);
    oc::quantize_act_fp8(dx.as<__nv_bfloat16>(), in, n, in, rq.as<void>(), rs.as<float>(), nullptr,
                         pad);
    oc::gemm_fp8(ctx, rq.as<void>(), rs.as<float>(), pad, in, wq.as<void>(), ws.as<float>(),
                 oc::Fp8Blocks::Tile128, out, ref.as<__nv_bfloat16>(), nullptr, out, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got32 = download<float>(y32, init.size());
    const auto gotb = download<uint16_t>(yb, static_cast<size_t>(n * out));
    const auto want = download<uint16_t>(ref, static_cast<size_t>(pad * out));
    float amax = 0;
    for (int64_t i = 0; i < n * out; ++i) amax = std::max(amax, std::abs(bf16_to_f32(want[i])));
    for (int64_t t = 0; t < n + 3; ++t)
        for (int64_t o = 0; o < ldy; ++o) {
            const float g = got32[t * ldy + o];
            if (t >= n || o >= out) {
                ASSERT_EQ(g, -7.0f) << "row " << t << " column " << o << " was written";
                continue;
            }
            const float e = bf16_to_f32(want[t * out + o]);
            ASSERT_NEAR(g, e, amax / 128) << "row " << t << " column " << o;  // bf16 rounding
            ASSERT_NEAR(bf16_to_f32(gotb[t * out + o]), e, amax / 128) << t << ", " << o;
        }
}

// Five experts, one of them empty, counts not multiples of 4: every routed row lands in its
// expert's padded block, quantised with its scale in the expert's [D/128][m4] scale block.
TEST(MoeFp8, GatherQuantPadsEveryExpertToFourRows) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int E = 5, K = 2;
    const int64_t D = 256, tokens = 10, n_assign = tokens * K;
    const std::vector<int32_t> counts{3, 0, 6, 1, 10};
    // Assignment a's expert: counts[e] assignments each, in a scrambled order.
    std::vector<int32_t> expert(n_assign);
    for (int e = 0, a = 0; e < E; ++e)
        for (int i = 0; i < counts[e]; ++i) expert[(a++ * 7) % n_assign] = e;
    std::vector<int32_t> perm(n_assign);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int32_t a, int32_t b) { return expert[a] < expert[b]; });
    const std::vector<float> weight = test_cuda::random_f32(n_assign, 8);
    std::vector<float> y = test_cuda::random_bf16(tokens * D, 9);
    for (int64_t t = 0; t < tokens; ++t)  // every token and 128 channels its own magnitude
        for (int64_t c = 0; c < D; ++c)
            y[t * D + c] *= std::ldexp(1.0f, int((t * 3 + c / 128) % 9) - 4);
    std::vector<int64_t> first(E + 1, 0), pfirst(E + 1, 0);
    for (int e = 0; e < E; ++e) {
        first[e + 1] = first[e] + counts[e];
        pfirst[e + 1] = pfirst[e] + oc::padded_rows(counts[e]);
    }
    const int64_t n_pad = pfirst[E];
    ASSERT_EQ(n_pad, 4 + 0 + 8 + 4 + 12);
    ASSERT_LE(n_pad, oc::max_padded_rows(n_assign, E));
    const cuda::DeviceBuffer dy = upload(to_bf16(y)), dperm = upload(perm), dw = upload(weight),
                             dc = upload(counts);
    cuda::DeviceBuffer dfirst((E + 1) * 4), dpfirst((E + 1) * 4), xq(n_pad * D),
        xs(n_pad * D / 128 * 4), sp(n_pad * 4), inv(n_assign * 4);
    oc::expert_offsets(dc.as<int32_t>(), E, dfirst.as<int32_t>(), dpfirst.as<int32_t>(), nullptr);
    oc::gather_quant_fp8(dy.as<__nv_bfloat16>(), D, dperm.as<int32_t>(), K, dw.as<float>(),
                         dc.as<int32_t>(), dfirst.as<int32_t>(), dpfirst.as<int32_t>(), E, n_pad,
                         xq.as<void>(), xs.as<float>(), sp.as<float>(), inv.as<int32_t>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gpf = download<int32_t>(dpfirst, E + 1);
    const auto gf = download<int32_t>(dfirst, E + 1);
    for (int e = 0; e <= E; ++e) {
        EXPECT_EQ(gpf[e], pfirst[e]) << e;
        EXPECT_EQ(gf[e], first[e]) << e;
    }
    const auto q = download<uint8_t>(xq, n_pad * D);
    const auto s = download<float>(xs, n_pad * D / 128);
    const auto spw = download<float>(sp, n_pad);
    const auto iv = download<int32_t>(inv, n_assign);
    for (int e = 0; e < E; ++e) {
        const int64_t m4 = pfirst[e + 1] - pfirst[e];
        for (int64_t i = 0; i < m4; ++i) {
            const int64_t p = pfirst[e] + i;
            const bool valid = i < counts[e];
            const int32_t a = valid ? perm[first[e] + i] : -1;
            EXPECT_EQ(spw[p], valid ? weight[a] : 0.0f) << "row " << p;
            if (valid) {
                EXPECT_EQ(iv[a], p) << "assignment " << a;
            }
            for (int64_t kb = 0; kb < D / 128; ++kb) {
                const float sc = s[pfirst[e] * (D / 128) + kb * m4 + i];
                if (!valid) {
                    ASSERT_EQ(sc, 1.0f) << "pad row " << p;
                }
                for (int64_t c = kb * 128; c < kb * 128 + 128; ++c) {
                    const float want = valid ? y[(a / K) * D + c] : 0.0f;
                    expect_quantised(e4m3_to_f32(q[p * D + c]) * sc, want, sc, "row", p * D + c);
                }
            }
        }
    }
}

TEST(MoeFp8, SwigluQuantEqualsTheSwigluOfTheRows) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int64_t m4 = 8, width = 256;
    const float limit = 2.5f;
    const std::vector<float> gu = test_cuda::random_bf16(m4 * 2 * width, 12, 1.5f);
    const std::vector<float> rs = test_cuda::random_f32(m4, 13);
    const cuda::DeviceBuffer dgu = upload(to_bf16(gu)), drs = upload(rs);
    cuda::DeviceBuffer aq(m4 * width), as(m4 * width / 128 * 4);
    oc::swiglu_quant_fp8(dgu.as<__nv_bfloat16>(), m4, width, limit, drs.as<float>(), aq.as<void>(),
                         as.as<float>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto q = download<uint8_t>(aq, m4 * width);
    const auto s = download<float>(as, m4 * width / 128);
    for (int64_t r = 0; r < m4; ++r)
        for (int64_t c = 0; c < width; ++c) {
            const float g = std::min(gu[r * 2 * width + c], limit);
            const float u = std::clamp(gu[r * 2 * width + width + c], -limit, limit);
            const float want = g / (1.0f + std::exp(-g)) * u * rs[r];
            const float sc = s[(c / 128) * m4 + r];
            expect_quantised(e4m3_to_f32(q[r * width + c]) * sc, want, sc * 1.001f, "act",
                             r * width + c);
        }
}

}  // namespace
}  // namespace cpfill
