// The fp8 activation paths of the GPU model: fp8_linear for any row count (the 4-row tail), and the
// routed experts' padded fp8 rows (ops/cuda/moe_fp8.h): expert offsets and gather by expert with
// quantisation, with and without the shared expert as expert E, and SwiGLU with quantisation; and
// the combine of the expert outputs with the shared expert's in bf16 (ops/cuda/moe_dispatch.h).
// Each against a host computation of the same thing: offsets, gather and combine to the bit, on
// the 16-byte and the scalar path, and the SwiGLU of all experts at once to the bit as per expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/moe_dispatch.h"
#include "ops/cuda/moe_fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::quantise_block;
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

// Bit-for-bit equality: the number of mismatches and the first of them.
template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (!(got[i] == want[i]) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": " << +got[first] << ", expected "
                       << +want[first];
}

// Padded row offsets of the experts (pfirst [E + 1]).
std::vector<int32_t> padded_offsets(const std::vector<int32_t>& counts) {
    std::vector<int32_t> pfirst(counts.size() + 1, 0);
    for (size_t e = 0; e < counts.size(); ++e)
        pfirst[e + 1] = pfirst[e] + static_cast<int32_t>(oc::padded_rows(counts[e]));
    return pfirst;
}

// expert_offsets with the shared expert as expert E: E + 2 entries, the routed prefix sums of the
// counts and of their padded counts, then shared_rows more rows and padded_rows(shared_rows) more
// padded rows; without it E + 1 entries. Nothing written past them. Empty experts first, last and
// between, one expert, 256 experts; shared row counts below, at and above multiples of 4 and 128.
TEST(MoeFp8, ExpertOffsetsPutTheSharedExpertLast) {
    CPFILL_SKIP_WITHOUT_GPU();
    std::vector<int32_t> many(256);
    std::mt19937_64 rng(61);
    for (int32_t& c : many) c = rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 40);
    const std::vector<std::vector<int32_t>> count_sets{
        {0, 5, 0, 0, 3, 0}, {0}, {7}, {4, 1, 8, 6}, many};
    for (const auto& counts : count_sets) {
        const int E = static_cast<int>(counts.size());
        const cuda::DeviceBuffer dc = upload(counts);
        for (const int64_t shared_rows : {0, 1, 4, 5, 8, 127, 128, 130}) {
            SCOPED_TRACE(::testing::Message()
                         << E << " experts, " << shared_rows << " shared rows");
            std::vector<int32_t> first(E + 1, 0);
            for (int e = 0; e < E; ++e) first[e + 1] = first[e] + counts[e];
            std::vector<int32_t> pfirst = padded_offsets(counts);
            if (shared_rows > 0) {
                first.push_back(first[E] + static_cast<int32_t>(shared_rows));
                pfirst.push_back(pfirst[E] + static_cast<int32_t>(oc::padded_rows(shared_rows)));
                ASSERT_EQ(pfirst[E + 1] % oc::kExpertRowAlign, 0);
            }
            std::vector<int32_t> want_first(E + 3, -9), want_pfirst(E + 3, -9);
            const cuda::DeviceBuffer dfirst = upload(want_first), dpfirst = upload(want_pfirst);
            oc::expert_offsets(dc.as<int32_t>(), E, dfirst.as<int32_t>(), dpfirst.as<int32_t>(),
                               nullptr, shared_rows);
            CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
            std::copy(first.begin(), first.end(), want_first.begin());
            std::copy(pfirst.begin(), pfirst.end(), want_pfirst.begin());
            expect_same(download<int32_t>(dfirst, E + 3), want_first, "first");
            expect_same(download<int32_t>(dpfirst, E + 3), want_pfirst, "pfirst");
        }
    }
}

struct GatherCase {
    int64_t D;
    int top_k;
    std::vector<int32_t> counts;
    int64_t y_off, q_off;     // elements of y's buffer before y, bytes of xq's before xq
    int64_t shared_rows = 0;  // > 0: the shared expert's rows follow as expert E
};

// gather_quant_fp8 after expert_offsets (both with p.shared_rows) equals the host gather and
// quantisation bit for bit: first and pfirst, xq and its scales, sp and inv. The routed experts'
// rows are y[a / top_k] of their assignments; with p.shared_rows > 0 expert E's are y's rows 0 …
// shared_rows − 1 in order with routing weight 1, and inv stays unwritten for them. Pad rows are
// zeros with scale 1 and weight 0. Every (row, block) of y has its own magnitude, some an outlier;
// xq, xs, sp, inv, first and pfirst lie among sentinels.
void expect_gather_equals_host(const GatherCase& p) {
    const int E = static_cast<int>(p.counts.size());
    const bool with_shared = p.shared_rows > 0;
    const int64_t kb_n = p.D / 128;
    const int64_t n_assign = std::accumulate(p.counts.begin(), p.counts.end(), int64_t{0});
    ASSERT_EQ(n_assign % p.top_k, 0);
    const int64_t tokens = n_assign / p.top_k, y_rows = std::max(tokens, p.shared_rows);
    std::vector<int32_t> expert;  // of each assignment: counts[e] times e, shuffled
    for (int e = 0; e < E; ++e) expert.insert(expert.end(), p.counts[e], e);
    std::shuffle(expert.begin(), expert.end(), std::mt19937_64(31));
    std::vector<int32_t> perm(n_assign);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int32_t a, int32_t b) { return expert[a] < expert[b]; });
    const std::vector<float> weight = test_cuda::random_f32(n_assign, 32);
    std::vector<float> y = test_cuda::random_bf16(p.y_off + y_rows * p.D, 33);
    for (int64_t t = 0; t < y_rows; ++t)
        for (int64_t c = 0; c < p.D; ++c) {
            const int64_t kb = c / 128;
            float& v = y[p.y_off + t * p.D + c];
            v *= std::ldexp(1.0f, static_cast<int>((t * 3 + kb) % 9) - 4);
            if ((t + kb) % 5 == 0 && c % 128 == (t * 7 + kb) % 128) v *= 4096.0f;
        }
    // The experts as the device sees them: the shared one, when there, as expert E.
    std::vector<int32_t> rows = p.counts;
    if (with_shared) rows.push_back(static_cast<int32_t>(p.shared_rows));
    const int n_blocks = static_cast<int>(rows.size());
    std::vector<int32_t> first(n_blocks + 1, 0);
    for (int e = 0; e < n_blocks; ++e) first[e + 1] = first[e] + rows[e];
    const std::vector<int32_t> pfirst = padded_offsets(rows);
    const int64_t n_pad = pfirst[n_blocks];
    constexpr int64_t kTail = 8;  // sentinels after xs, sp, inv, first and pfirst
    const size_t q_bytes = p.q_off + n_pad * p.D + 64;
    std::vector<uint8_t> want_q(q_bytes, 0xA5);
    std::vector<float> want_s(n_pad * kb_n + kTail, -3.0f), want_sp(n_pad + kTail, -3.0f),
        block(128);
    std::vector<int32_t> want_inv(n_assign + p.shared_rows + kTail, -1);
    std::vector<int32_t> want_first(n_blocks + 1 + kTail, -9), want_pfirst = want_first;
    const cuda::DeviceBuffer dy = upload(to_bf16(y)), dperm = upload(perm), dw = upload(weight),
                             dc = upload(p.counts), xq = upload(want_q), xs = upload(want_s),
                             sp = upload(want_sp), inv = upload(want_inv),
                             dfirst = upload(want_first), dpfirst = upload(want_pfirst);
    oc::expert_offsets(dc.as<int32_t>(), E, dfirst.as<int32_t>(), dpfirst.as<int32_t>(), nullptr,
                       p.shared_rows);
    oc::gather_quant_fp8(dy.as<__nv_bfloat16>() + p.y_off, p.D, dperm.as<int32_t>(), p.top_k,
                         dw.as<float>(), dc.as<int32_t>(), dfirst.as<int32_t>(),
                         dpfirst.as<int32_t>(), E, n_pad, xq.as<uint8_t>() + p.q_off,
                         xs.as<float>(), sp.as<float>(), inv.as<int32_t>(), nullptr, p.shared_rows);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    std::copy(first.begin(), first.end(), want_first.begin());
    std::copy(pfirst.begin(), pfirst.end(), want_pfirst.begin());
    for (int e = 0; e < n_blocks; ++e) {
        const bool shared = e == E;
        const int64_t m4 = pfirst[e + 1] - pfirst[e];
        for (int64_t i = 0; i < m4; ++i) {
            const int64_t r = pfirst[e] + i;
            const bool valid = i < rows[e];
            const int32_t a = valid && !shared ? perm[first[e] + i] : 0;
            const int64_t row = shared ? i : a / p.top_k;  // of y
            for (int64_t kb = 0; kb < kb_n; ++kb) {
                for (int64_t k = 0; k < 128; ++k)
                    block[k] = valid ? y[p.y_off + row * p.D + kb * 128 + k] : 0.0f;
                want_s[pfirst[e] * kb_n + kb * m4 + i] =
                    quantise_block(block.data(), &want_q[p.q_off + r * p.D + kb * 128]);
            }
            want_sp[r] = !valid ? 0.0f : shared ? 1.0f : weight[a];
            if (valid && !shared) want_inv[a] = static_cast<int32_t>(r);
        }
    }
    expect_same(download<int32_t>(dfirst, want_first.size()), want_first, "first");
    expect_same(download<int32_t>(dpfirst, want_pfirst.size()), want_pfirst, "pfirst");
    expect_same(download<uint8_t>(xq, q_bytes), want_q, "xq");
    expect_same(download<float>(xs, want_s.size()), want_s, "xs");
    expect_same(download<float>(sp, want_sp.size()), want_sp, "sp");
    expect_same(download<int32_t>(inv, want_inv.size()), want_inv, "inv");
}

class MoeFp8Gather : public ::testing::TestWithParam<GatherCase> {};

// The routed experts alone: empty experts first, last and between, padded rows not a multiple of
// the kernel's 8 rows per block; on the 16-byte path and the scalar one (y or xq misaligned).
TEST_P(MoeFp8Gather, EqualsTheHostGatherBitForBit) {
    CPFILL_SKIP_WITHOUT_GPU();
    expect_gather_equals_host(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeFp8Gather,
    ::testing::Values(GatherCase{1408, 2, {0, 3, 0, 6, 1, 10, 0}, 0, 0},  // 11 blocks a row
                      GatherCase{4096, 1, {17, 0, 5, 2}, 0, 0},           // d_model: 4 steps
                      GatherCase{256, 2, {3, 0, 6, 1, 10}, 1, 0},         // y misaligned
                      GatherCase{384, 3, {2, 7, 0, 3}, 0, 4}));           // xq misaligned

class MoeFp8GatherShared : public ::testing::TestWithParam<GatherCase> {};

// With the shared expert as expert E (every token's row, docs/fp8.md): the routed rows exactly as
// without it, then y's rows in order quantised the same way with weight 1, its pad rows zeros with
// scale 1 and weight 0, and inv written for the routed assignments only. Row counts not multiples
// of 4 (1, 5, 10, 130) and one (24) that is, the last routed expert empty, no routed rows at all;
// on the 16-byte path and the scalar one (y or xq misaligned).
TEST_P(MoeFp8GatherShared, SharedExpertRowsFollowTheRoutedOnesBitForBit) {
    CPFILL_SKIP_WITHOUT_GPU();
    expect_gather_equals_host(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeFp8GatherShared,
    ::testing::Values(GatherCase{1408, 2, {0, 3, 0, 6, 1, 10, 0}, 0, 0, 10},  // 11 blocks a row
                      GatherCase{4096, 1, {17, 0, 5, 2}, 0, 0, 24},           // 4 steps, 24 rows
                      GatherCase{256, 2, {3, 0, 6, 1, 10}, 1, 0, 10},         // y misaligned
                      GatherCase{384, 3, {2, 7, 0, 3, 3}, 0, 4, 5},           // xq misaligned
                      GatherCase{256, 2, {100, 0, 60, 100}, 0, 0, 130},       // 130 rows
                      GatherCase{128, 1, {1}, 0, 0, 1},                       // one token
                      GatherCase{256, 1, {0, 0, 0}, 0, 0, 5}));  // no routed rows at all

struct SwigluCase {
    int64_t width;
    float limit;
    std::vector<int32_t> counts;  // rows of each expert before padding
    int64_t gu_off, q_off;        // elements of gate_up's buffer before it, bytes of aq's before aq
};

class MoeFp8Swiglu : public ::testing::TestWithParam<SwigluCase> {};

// swiglu_quant_fp8_experts over all experts equals swiglu_quant_fp8 per expert bit for bit (the
// grouped and per-expert schedules agree on every row), and the host SwiGLU to e4m3 rounding with
// each block's scale amax / 448 (the device's expf is not the host's: not to the bit); pad rows,
// routing weight 0, are zeros with scale 1. On the 16-byte path and the scalar one (gate_up or aq
// misaligned); aq lies among sentinels.
TEST_P(MoeFp8Swiglu, ExpertsEqualThePerExpertLaunchesAndTheHost) {
    CPFILL_SKIP_WITHOUT_GPU();
    const SwigluCase p = GetParam();
    const int E = static_cast<int>(p.counts.size());
    const int64_t w = p.width, kb_n = w / 128;
    const std::vector<int32_t> pfirst = padded_offsets(p.counts);
    const int64_t n_pad = pfirst[E];
    const std::vector<float> gu = test_cuda::random_bf16(p.gu_off + n_pad * 2 * w, 41, 1.5f);
    std::vector<float> rs = test_cuda::random_f32(n_pad, 42);
    for (int e = 0; e < E; ++e)
        for (int64_t r = pfirst[e] + p.counts[e]; r < pfirst[e + 1]; ++r) rs[r] = 0.0f;
    const size_t q_bytes = p.q_off + n_pad * w + 64;
    const std::vector<uint8_t> q0(q_bytes, 0xA5);
    const std::vector<float> s0(n_pad * kb_n, -3.0f);
    const cuda::DeviceBuffer dgu = upload(to_bf16(gu)), drs = upload(rs), dpfirst = upload(pfirst),
                             aq_all = upload(q0), as_all = upload(s0), aq_each = upload(q0),
                             as_each = upload(s0);
    const __nv_bfloat16* g = dgu.as<__nv_bfloat16>() + p.gu_off;
    oc::swiglu_quant_fp8_experts(g, n_pad, w, p.limit, drs.as<float>(), dpfirst.as<int32_t>(), E,
                                 aq_all.as<uint8_t>() + p.q_off, as_all.as<float>(), nullptr);
    for (int e = 0; e < E; ++e) {
        const int64_t off = pfirst[e];
        oc::swiglu_quant_fp8(g + off * 2 * w, pfirst[e + 1] - off, w, p.limit,
                             drs.as<float>() + off, aq_each.as<uint8_t>() + p.q_off + off * w,
                             as_each.as<float>() + off * kb_n, nullptr);
    }
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto q = download<uint8_t>(aq_all, q_bytes);
    const auto s = download<float>(as_all, s0.size());
    expect_same(download<uint8_t>(aq_each, q_bytes), q, "aq per expert");
    expect_same(download<float>(as_each, s0.size()), s, "as per expert");
    const size_t q_begin = p.q_off, q_end = p.q_off + n_pad * w;  // sentinels around aq
    for (size_t i = 0; i < q_bytes; ++i)
        if (i < q_begin || i >= q_end) {
            ASSERT_EQ(q[i], 0xA5) << "byte " << i;
        }
    std::vector<float> act(128);
    for (int e = 0; e < E; ++e) {
        const int64_t m4 = pfirst[e + 1] - pfirst[e];
        for (int64_t i = 0; i < m4; ++i) {
            const int64_t r = pfirst[e] + i;
            for (int64_t kb = 0; kb < kb_n; ++kb) {
                float amax = 0.0f;
                for (int64_t k = 0; k < 128; ++k) {
                    const int64_t c = kb * 128 + k;
                    float gate = gu[p.gu_off + r * 2 * w + c],
                          up = gu[p.gu_off + r * 2 * w + w + c];
                    if (p.limit > 0.0f) {
                        gate = std::min(gate, p.limit);
                        up = std::clamp(up, -p.limit, p.limit);
                    }
                    act[k] = gate / (1.0f + std::exp(-gate)) * up * rs[r];
                    amax = std::max(amax, std::abs(act[k]));
                }
                const float sc = s[pfirst[e] * kb_n + kb * m4 + i];
                if (i >= p.counts[e]) {
                    ASSERT_EQ(sc, 1.0f) << "pad row " << r;
                }
                ASSERT_NEAR(sc, amax > 0.0f ? amax / 448.0f : 1.0f, sc * 1e-5f) << "row " << r;
                for (int64_t k = 0; k < 128; ++k) {
                    const size_t at = p.q_off + r * w + kb * 128 + k;
                    expect_quantised(e4m3_to_f32(q[at]) * sc, act[k], sc * 1.001f, "act", at);
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeFp8Swiglu,
    ::testing::Values(SwigluCase{1408, 2.5f, {5, 0, 9, 2, 1}, 0, 0},  // 11 blocks a row
                      SwigluCase{2048, 0.0f, {3, 6}, 0, 0},           // moe_dim, no limit
                      SwigluCase{256, 2.5f, {5, 0, 3}, 1, 0},         // gate_up misaligned
                      SwigluCase{384, 2.5f, {2, 7}, 0, 4}));          // aq misaligned

struct CombineCase {
    int64_t n;
    int top_k;
    int64_t D;
    int64_t shared_off, op_off,
        out_off;  // elements of each buffer before shared (and acc), op, out
};

class MoeCombineShared : public ::testing::TestWithParam<CombineCase> {};

// combine_experts with the shared expert's output in bf16 equals the fp32 overload given acc =
// float(shared) bit for bit, and the host's fp32 sum shared[t] + op[inv[t·K]] + … + op[inv[t·K +
// K − 1]] in that order rounded to bf16 (additions only, so the host's bits are the device's). On
// the 8-wide path and the scalar one (d_model % 8 ≠ 0, or shared, op or out off 16 bytes; an
// offset of 4 elements puts the bf16 shared off 16 bytes but the fp32 acc on them, so the two
// overloads take different paths); inv a shuffled permutation; out lies among sentinels.
TEST_P(MoeCombineShared, Bf16SharedEqualsTheFp32OverloadAndTheHostSum) {
    CPFILL_SKIP_WITHOUT_GPU();
    const CombineCase c = GetParam();
    const int64_t D = c.D, n_assign = c.n * c.top_k;
    constexpr uint16_t kSentinel = 0xc0e0;  // bf16 -7.0
    // Shared outputs larger than the expert outputs: the roundings of the partial sums matter.
    const std::vector<float> shared = test_cuda::random_bf16(c.shared_off + c.n * D, 51, 4.0f);
    const std::vector<float> op = test_cuda::random_bf16(c.op_off + n_assign * D, 52);
    std::vector<int32_t> inv(n_assign);
    std::iota(inv.begin(), inv.end(), 0);
    std::shuffle(inv.begin(), inv.end(), std::mt19937_64(53));
    const size_t out_n = c.out_off + c.n * D + 16;
    std::vector<uint16_t> want(out_n, kSentinel);
    const cuda::DeviceBuffer dshared = upload(to_bf16(shared)), dacc = upload(shared),
                             dop = upload(to_bf16(op)), dinv = upload(inv), out_bf16 = upload(want),
                             out_f32 = upload(want);
    const __nv_bfloat16* o = dop.as<__nv_bfloat16>() + c.op_off;
    oc::combine_experts(dshared.as<__nv_bfloat16>() + c.shared_off, o, dinv.as<int32_t>(), c.n,
                        c.top_k, D, out_bf16.as<__nv_bfloat16>() + c.out_off, nullptr);
    oc::combine_experts(dacc.as<float>() + c.shared_off, o, dinv.as<int32_t>(), c.n, c.top_k, D,
                        out_f32.as<__nv_bfloat16>() + c.out_off, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t t = 0; t < c.n; ++t)
        for (int64_t d = 0; d < D; ++d) {
            float s = shared[c.shared_off + t * D + d];
            for (int k = 0; k < c.top_k; ++k) s += op[c.op_off + inv[t * c.top_k + k] * D + d];
            want[c.out_off + t * D + d] = f32_to_bf16(s);
        }
    const auto got = download<uint16_t>(out_bf16, out_n);
    expect_same(got, download<uint16_t>(out_f32, out_n), "bf16 shared against fp32 acc");
    expect_same(got, want, "bf16 shared against the host");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeCombineShared,
    ::testing::Values(CombineCase{37, 6, 1024, 0, 0, 0},  // 8-wide
                      CombineCase{9, 8, 4096, 0, 0, 0},   // 8-wide, d_model of V4-Flash
                      CombineCase{37, 6, 1000, 0, 0, 0},  // 8-wide, d_model / 8 odd
                      CombineCase{23, 3, 300, 0, 0, 0},   // scalar: d_model % 8 = 4
                      CombineCase{23, 3, 129, 0, 0, 0},   // scalar: d_model odd
                      CombineCase{17, 2, 512, 1, 0, 0},   // scalar: shared and acc misaligned
                      CombineCase{17, 2, 512, 4, 0, 0},   // scalar bf16 shared, 8-wide fp32 acc
                      CombineCase{17, 2, 512, 0, 1, 0},   // scalar: op misaligned
                      CombineCase{17, 2, 512, 0, 0, 1},   // scalar: out misaligned
                      CombineCase{1, 1, 8, 0, 0, 0},      // one token, one expert
                      CombineCase{0, 2, 256, 0, 0, 0}));  // no tokens: nothing written

}  // namespace
}  // namespace cpfill
