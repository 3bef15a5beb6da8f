// The grouped fp8 expert GEMM (ops/cuda/grouped_fp8.h) against the fp64 product of its dequantised
// inputs on the host, with each epilogue (Registers, TmaStore). Inputs are e4m3 bytes with a
// power-of-two scale per (row, 128 columns) of x and per 128 × 128 tile of w, each block at its own
// magnitude (2^-6 … 2^6), so a scale read from the wrong block is off by orders of magnitude;
// expert sizes include 0, 4 and row tiles cut short at every multiple of 4 rows, more tiles than
// multiprocessors and more k-blocks than pipeline stages. Both epilogues store the same fp32 sums
// rounded the same way, so their outputs must be bit-identical; and neither may write a row past
// an expert's padded block, which the TMA boxes of TmaStore could. The last expert's weights held
// apart (w_last, ws_last: the shared expert's) must give the bits of all in one buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/grouped_fp8.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/fp8_blocks.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using oc::GroupedFp8Epilogue;
using test_cuda::download;
using test_cuda::upload;

constexpr uint16_t kSentinel = 0xc0e0;  // bf16 -7.0: rows no launch may write

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

// The inputs of one case on the host and the device.
struct Problem {
    int E = 0;
    int64_t K = 0, N = 0, kb_n = 0, n_pad = 0, spm = 0, ws_ld = 0;
    std::vector<int32_t> pfirst;  // [E + 1]
    std::vector<uint8_t> xq, wq;  // e4m3 [n_pad, K], [E, N, K]
    std::vector<float> xs, ws;    // scales as the kernel reads them
    cuda::DeviceBuffer dxq, dxs, dwq, dws, dpf;
};

Problem make_problem(const Case& c, uint64_t seed) {
    Problem p;
    p.E = static_cast<int>(c.counts.size());
    p.K = c.in;
    p.N = c.out;
    p.kb_n = p.K / 128;
    const int E = p.E;
    const int64_t K = p.K, N = p.N, kb_n = p.kb_n;
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> mag(-6, 6);
    p.pfirst.assign(E + 1, 0);
    for (int e = 0; e < E; ++e)
        p.pfirst[e + 1] = p.pfirst[e] + int32_t(oc::padded_rows(c.counts[e]));
    p.n_pad = p.pfirst[E];
    // x: e4m3 rows; pad rows zeros with scale 1 (as gather_quant_fp8 writes them).
    p.xq.assign(p.n_pad * K, 0);
    p.xs.assign(p.n_pad * kb_n, 1.0f);
    for (int e = 0; e < E; ++e) {
        const int64_t m4 = p.pfirst[e + 1] - p.pfirst[e];
        for (int64_t i = 0; i < c.counts[e]; ++i) {
            const int64_t r = p.pfirst[e] + i;
            for (int64_t k = 0; k < K; ++k) p.xq[r * K + k] = random_e4m3(rng);
            for (int64_t kb = 0; kb < kb_n; ++kb)
                p.xs[p.pfirst[e] * kb_n + kb * m4 + i] = std::ldexp(1.0f, mag(rng));
        }
    }
    p.spm = ops::fp8_scale_count(N, K, ops::Fp8Blocks::Tile128);
    p.ws_ld = p.spm / (N / 128);
    p.wq.resize(E * N * K);
    p.ws.assign(E * p.spm, 1.0f);
    for (auto& b : p.wq) b = random_e4m3(rng);
    for (int e = 0; e < E; ++e)
        for (int64_t nt = 0; nt < N / 128; ++nt)
            for (int64_t kb = 0; kb < kb_n; ++kb)
                p.ws[e * p.spm + nt * p.ws_ld + kb] = std::ldexp(1.0f, mag(rng));
    p.dxq = upload(p.xq);
    p.dxs = upload(p.xs);
    p.dwq = upload(p.wq);
    p.dws = upload(p.ws);
    p.dpf = upload(p.pfirst);
    return p;
}

// The weights of a problem with the last expert's held apart (GroupedFp8Gemm::w_last, ws_last): w
// and ws in buffers of their own holding only the first E − 1 experts, which a read of expert E − 1
// at its place in them would overrun. For E = 1 they hold nothing: w and ws are nullptr.
struct WeightsApart {
    cuda::DeviceBuffer w, ws, w_last, ws_last;
};

WeightsApart hold_last_apart(const Problem& p) {
    const auto w_split = p.wq.begin() + (p.E - 1) * p.N * p.K;
    const auto ws_split = p.ws.begin() + (p.E - 1) * p.spm;
    WeightsApart a;
    a.w = upload(std::vector<uint8_t>(p.wq.begin(), w_split));
    a.ws = upload(std::vector<float>(p.ws.begin(), ws_split));
    a.w_last = upload(std::vector<uint8_t>(w_split, p.wq.end()));
    a.ws_last = upload(std::vector<float>(ws_split, p.ws.end()));
    return a;
}

// y bf16 [n_pad + 2, N] from one launch over the first n_experts experts (n_pad rows, the tensor
// maps' extent, stay the whole problem's), every row first set to the sentinel; the weights from
// p's one buffer, or with apart the last expert's held apart.
std::vector<uint16_t> run_gemm(const Problem& p, GroupedFp8Epilogue epi, int n_experts,
                               const WeightsApart* apart = nullptr) {
    const std::vector<uint16_t> init((p.n_pad + 2) * p.N, kSentinel);
    cuda::DeviceBuffer dy = upload(init);
    oc::GroupedFp8Gemm g;
    g.x = p.dxq.as<void>();
    g.xs = p.dxs.as<float>();
    g.n_pad = p.n_pad;
    g.pfirst = p.dpf.as<int32_t>();
    g.n_experts = n_experts;
    g.w = p.dwq.as<void>();
    g.ws = p.dws.as<float>();
    if (apart) {
        g.w = apart->w.as<void>();  // nullptr for E = 1: no expert but the last
        g.ws = apart->ws.as<float>();
        g.w_last = apart->w_last.as<void>();
        g.ws_last = apart->ws_last.as<float>();
    }
    g.ws_per_expert = p.spm;
    g.in = p.K;
    g.out = p.N;
    g.y = dy.as<__nv_bfloat16>();
    g.epilogue = epi;
    oc::grouped_gemm_fp8(g, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return download<uint16_t>(dy, init.size());
}

// y against the fp64 reference on every padded row, and the two rows after the last untouched.
void check_against_reference(const Problem& p, const std::vector<uint16_t>& y) {
    const int64_t K = p.K, N = p.N, kb_n = p.kb_n;
    std::vector<float> xf(p.xq.size()), wf(p.wq.size());
    for (size_t i = 0; i < p.xq.size(); ++i) xf[i] = e4m3_to_f32(p.xq[i]);
    for (size_t i = 0; i < p.wq.size(); ++i) wf[i] = e4m3_to_f32(p.wq[i]);
    double worst = 0;
    int64_t checked = 0;
    for (int e = 0; e < p.E; ++e) {
        const int64_t m4 = p.pfirst[e + 1] - p.pfirst[e];
        for (int64_t i = 0; i < m4; ++i) {
            const int64_t r = p.pfirst[e] + i;
            for (int64_t o = 0; o < N; o += (i % 5 == 0 ? 1 : 7)) {
                double sum = 0, mag_sum = 0;
                for (int64_t kb = 0; kb < kb_n; ++kb) {
                    const double s = double(p.xs[p.pfirst[e] * kb_n + kb * m4 + i]) *
                                     p.ws[e * p.spm + (o / 128) * p.ws_ld + kb];
                    double part = 0, part_abs = 0;
                    for (int64_t k = kb * 128; k < kb * 128 + 128; ++k) {
                        const double v = double(xf[r * K + k]) * wf[(e * N + o) * K + k];
                        part += v;
                        part_abs += std::abs(v);
                    }
                    sum += part * s;
                    mag_sum += part_abs * s;
                }
                const double got = bf16_to_f32(y[r * N + o]);
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
    for (int64_t r = p.n_pad; r < p.n_pad + 2; ++r)
        for (int64_t o = 0; o < N; ++o)
            ASSERT_EQ(y[r * N + o], kSentinel) << "row " << r << " after the last was written";
    std::printf("[ info ] %lld outputs checked, worst error %.3f of the tolerance\n",
                static_cast<long long>(checked), worst);
}

// Rows 4k - 1 for k = 1 … 32 (padded blocks of every multiple of 4 up to a full row tile, so each
// consumer's last tile holds every multiple of 4 from 4 to 64 rows), then 300 (three row tiles),
// 0 and 1; 384 outputs (the second output tile has only 128).
Case every_tail_length() {
    Case c{{}, 256, 384};
    for (int k = 1; k <= 32; ++k) c.counts.push_back(4 * k - 1);
    c.counts.insert(c.counts.end(), {300, 0, 1});
    return c;
}

const Case kSmall{{0, 3, 130, 0, 257, 1, 4}, 256, 384};
// 200 output tiles (more than the multiprocessors) and 8 k-blocks (more than the stages).
const Case kLong{{1200, 517, 0, 1280}, 1024, 2048};

class GroupedFp8 : public ::testing::TestWithParam<GroupedFp8Epilogue> {};

TEST_P(GroupedFp8, SmallExpertsAndEmptyOnes) {
    CPFILL_SKIP_WITHOUT_SM90();
    const Problem p = make_problem(kSmall, 1);
    check_against_reference(p, run_gemm(p, GetParam(), p.E));
}

TEST_P(GroupedFp8, MoreTilesThanMultiprocessorsAndLongK) {
    CPFILL_SKIP_WITHOUT_SM90();
    const Problem p = make_problem(kLong, 2);
    check_against_reference(p, run_gemm(p, GetParam(), p.E));
}

TEST_P(GroupedFp8, EveryTailLength) {
    CPFILL_SKIP_WITHOUT_SM90();
    const Problem p = make_problem(every_tail_length(), 3);
    check_against_reference(p, run_gemm(p, GetParam(), p.E));
}

// The launch over the first n experts only, with n_pad (the extent of the output tensor map) still
// every expert's rows: a box reaching past expert n - 1's padded block is not clipped by the map
// and would show in rows ≥ pfirst[n], which must keep the sentinel.
TEST_P(GroupedFp8, NothingWrittenPastAnExpertsPaddedRows) {
    CPFILL_SKIP_WITHOUT_SM90();
    const Problem p = make_problem(every_tail_length(), 4);
    for (int n = 1; n <= p.E; ++n) {
        const std::vector<uint16_t> y = run_gemm(p, GetParam(), n);
        for (int64_t r = p.pfirst[n]; r < p.n_pad + 2; ++r)
            for (int64_t o = 0; o < p.N; ++o)
                ASSERT_EQ(y[r * p.N + o], kSentinel)
                    << "over the first " << n << " experts (" << p.pfirst[n]
                    << " padded rows): row " << r << " column " << o << " was written";
    }
}

// The last expert's weights and scales held apart (w_last, ws_last: the shared expert's) give the
// bits of all experts' in one buffer, and the reference: the last expert with row counts off the
// 128-row tiles (130, 517) among empty experts, with more tiles than multiprocessors and long K,
// the last expert the only non-empty one, the last expert empty, and E = 1 (w and ws nullptr).
TEST_P(GroupedFp8, LastExpertHeldApartEqualsOneBuffer) {
    CPFILL_SKIP_WITHOUT_SM90();
    struct {
        Case c;
        uint64_t seed;
        bool reference;  // also against the fp64 reference (the small ones)
    } const cases[] = {
        {{{0, 3, 130, 0, 257, 1, 130}, 256, 384}, 11, true},
        {{{1200, 0, 64, 517}, 1024, 2048}, 12, false},
        {{{0, 0, 0, 130}, 256, 384}, 13, true},
        {{{5, 130, 0}, 256, 384}, 14, true},
        {{{517}, 384, 256}, 15, true},
    };
    for (const auto& [c, seed, reference] : cases) {
        SCOPED_TRACE(::testing::Message() << "seed " << seed);
        const Problem p = make_problem(c, seed);
        const WeightsApart a = hold_last_apart(p);
        const std::vector<uint16_t> one = run_gemm(p, GetParam(), p.E),
                                    held = run_gemm(p, GetParam(), p.E, &a);
        ASSERT_EQ(one.size(), held.size());
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < one.size(); ++i)
            if (one[i] != held[i]) {
                if (first < 0) first = static_cast<int64_t>(i);
                ++differ;
            }
        EXPECT_EQ(differ, 0) << differ << " of " << one.size()
                             << " outputs differ; the first at row " << first / p.N << " column "
                             << first % p.N << " (one buffer " << std::hex << one[first]
                             << ", held apart " << held[first] << ")";
        if (reference) check_against_reference(p, held);
    }
}

TEST_P(GroupedFp8, RefusesWidthsOffTheBlocks) {
    CPFILL_SKIP_WITHOUT_GPU();
    oc::GroupedFp8Gemm g;
    g.n_experts = 1;
    g.in = 200;
    g.out = 128;
    g.n_pad = 4;
    g.epilogue = GetParam();
    EXPECT_THROW(oc::grouped_gemm_fp8(g, nullptr), Error);
}

INSTANTIATE_TEST_SUITE_P(Epilogues, GroupedFp8,
                         ::testing::Values(GroupedFp8Epilogue::Registers,
                                           GroupedFp8Epilogue::TmaStore),
                         [](const ::testing::TestParamInfo<GroupedFp8Epilogue>& info) {
                             return std::string(oc::grouped_fp8_epilogue_name(info.param));
                         });

// The same sums, rounded the same way: only the path to global memory differs.
TEST(GroupedFp8Epilogues, BitIdentical) {
    CPFILL_SKIP_WITHOUT_SM90();
    const std::pair<Case, uint64_t> cases[] = {{kSmall, 5}, {kLong, 6}, {every_tail_length(), 7}};
    for (const auto& [c, seed] : cases) {
        const Problem p = make_problem(c, seed);
        const std::vector<uint16_t> reg = run_gemm(p, GroupedFp8Epilogue::Registers, p.E),
                                    tma = run_gemm(p, GroupedFp8Epilogue::TmaStore, p.E);
        ASSERT_EQ(reg.size(), tma.size());
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < reg.size(); ++i)
            if (reg[i] != tma[i]) {
                if (first < 0) first = static_cast<int64_t>(i);
                ++differ;
            }
        EXPECT_EQ(differ, 0) << "seed " << seed << ": " << differ << " of " << reg.size()
                             << " outputs differ; the first at row " << first / p.N << " column "
                             << first % p.N << " (registers " << std::hex << reg[first]
                             << ", tma_store " << tma[first] << ")";
    }
}

}  // namespace
}  // namespace cpfill
