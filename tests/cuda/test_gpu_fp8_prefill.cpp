// The GPU prefill with the release's formats (issue 11, docs/fp8.md): an upstream-format checkpoint
// with fp8 linears and fp4 routed experts, run on the GPU with --weights auto (fp8 e4m3 with block
// scales, fp8 activations) and with bf16 weights, both against the CPU backend's fp32 run of the
// same weights dequantised (the reference: the CPU equals HF float32 on them). The model is tiny
// with 16 indexer heads (fewer make the indexer's top-k boundary a tie; see the file comment of
// test_gpu_prefill.cpp for how rows are compared) and widths that are multiples of 128, so that
// every fp8 path runs: Tile128 dense linears (wo_a per group, the shared expert), Row128 experts
// with padded rows, and row counts that are not multiples of 4.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "../golden/golden_util.h"
#include "../unit/engine/fp8_fixture.h"
#include "../unit/io/io_test_util.h"
#include "cuda_test_util.h"
#include "engine/prefill_engine.h"
#include "io/checkpoint.h"
#include "model/weight_bytes.h"

namespace cpfill {
namespace {

// One upstream fp8 + fp4 checkpoint for the whole binary (written once).
const std::string& checkpoint_dir() { return test::fp8_fixture_dir(); }

// device_weights: "cpu", "cpu-fp8" (the CPU with the fp8 path's roundings: its activations,
// EngineOptions::activations Fp8, and its indexer's queries and keys, indexer_rounding Fp8) or a
// --weights value for the GPU.
RunResult run(const std::string& device_weights, TboMode tbo = TboMode::Off,
              ExpertGemm experts = ExpertGemm::Auto, GpuIndexer indexer = GpuIndexer::Auto,
              bool* indexer_fp8 = nullptr) {
    EngineOptions eo;
    eo.gpu.indexer = indexer;
    eo.threads = 2;
    eo.cuda = device_weights.rfind("cpu", 0) != 0;
    if (device_weights == "cpu-fp8") {
        eo.activations = ActRounding::Fp8;
        eo.indexer_rounding = IndexerRounding::Fp8;
    }
    if (eo.cuda) eo.weights = device_weights;
    PrefillEngine engine(checkpoint_dir(), eo);
    if (indexer_fp8) *indexer_fp8 = engine.gpu_weight_stats().indexer_fp8;
    RunOptions o;
    o.all_logits = true;
    o.record_topk = true;  // the indexer's selections and the router's choices
    o.tbo = tbo;
    o.expert_gemm = experts;
    return engine.run(test::fp8_fixture_requests(), o);
}

struct Agreement {
    double argmax = 0;  // fraction of positions whose argmax equals the reference's
    testing::RowErrors err;
};

Agreement compare(const RunResult& got, const RunResult& ref, double tol) {
    Agreement a;
    int64_t same = 0, rows = 0;
    std::vector<float> all_got, all_ref;
    for (size_t r = 0; r < ref.out.logits.size(); ++r) {
        const Tensor& g = got.out.logits[r];
        const Tensor& e = ref.out.logits[r];
        const int64_t V = e.dim(1);
        for (int64_t t = 0; t < e.dim(0); ++t, ++rows)
            same += argmax(g.f32() + t * V, V) == argmax(e.f32() + t * V, V);
        all_got.insert(all_got.end(), g.f32(), g.f32() + g.numel());
        all_ref.insert(all_ref.end(), e.f32(), e.f32() + e.numel());
    }
    a.argmax = static_cast<double>(same) / static_cast<double>(rows);
    const int64_t V = ref.out.logits[0].dim(1);
    a.err =
        testing::row_errors(Tensor::borrow(DType::F32, {rows, V}, all_got.data(), nullptr),
                            Tensor::borrow(DType::F32, {rows, V}, all_ref.data(), nullptr), tol);
    return a;
}

// The rows (batch order) whose router choices in every layer and indexer selections in every CSA
// layer are the same sets in both runs.
std::vector<bool> same_choices(const RunResult& a, const RunResult& b) {
    const auto same_set = [](const Tensor& x, const Tensor& y, int64_t row) {
        const int64_t w = x.dim(1);
        const int32_t* p = x.data<int32_t>() + row * w;
        return std::is_permutation(p, p + w, y.data<int32_t>() + row * w);
    };
    const int64_t T = a.out.routes.at(0).dim(0);
    std::vector<bool> same(T, true);
    for (size_t li = 0; li < a.out.routes.size(); ++li)
        for (int64_t t = 0; t < T; ++t) {
            if (!same_set(a.out.routes[li], b.out.routes[li], t)) same[t] = false;
            if (a.out.topk[li].defined() && !same_set(a.out.topk[li], b.out.topk[li], t))
                same[t] = false;
        }
    return same;
}

// Per row ‖got − ref‖ / ‖ref‖ of the logits, in batch order.
std::vector<double> row_errors_of(const RunResult& got, const RunResult& ref) {
    std::vector<double> e;
    for (size_t r = 0; r < ref.out.logits.size(); ++r) {
        const Tensor& g = got.out.logits[r];
        const Tensor& x = ref.out.logits[r];
        const int64_t V = x.dim(1);
        for (int64_t t = 0; t < x.dim(0); ++t) {
            double num = 0, den = 0;
            for (int64_t i = t * V; i < (t + 1) * V; ++i) {
                const double d = double(g.f32()[i]) - x.f32()[i];
                num += d * d;
                den += double(x.f32()[i]) * x.f32()[i];
            }
            e.push_back(std::sqrt(num / den));
        }
    }
    return e;
}

// The quantile q of the per-row errors (row_errors_of) over all rows (a median is blind to the
// few rows whose routing flipped, whose error is O(1)).
double row_quantile(const RunResult& got, const RunResult& ref, double q) {
    std::vector<double> e = row_errors_of(got, ref);
    std::sort(e.begin(), e.end());
    return e[static_cast<size_t>(q * double(e.size() - 1))];
}

// ‖got − ref‖ / ‖ref‖ over every logit of every request.
double overall(const RunResult& got, const RunResult& ref) {
    double num = 0, den = 0;
    for (size_t r = 0; r < ref.out.logits.size(); ++r) {
        const Tensor& g = got.out.logits[r];
        const Tensor& e = ref.out.logits[r];
        for (int64_t i = 0; i < e.numel(); ++i) {
            const double d = double(g.f32()[i]) - e.f32()[i];
            num += d * d;
            den += double(e.f32()[i]) * e.f32()[i];
        }
    }
    return std::sqrt(num / den);
}

TEST(GpuFp8Prefill, AutoMeansFp4ExpertsForAnFp4Checkpoint) {
    const Checkpoint ck(checkpoint_dir());
    EXPECT_EQ(stored_gpu_format(ck), GpuWeightFormat::Fp4);
    EXPECT_EQ(resolve_gpu_format("bf16", ck), GpuWeightFormat::Bf16);
    EXPECT_THROW(resolve_gpu_format("fp16", ck), Error);
}

// fp8 and bf16 against the CPU's fp32 on the same weights: each within its activation rounding.
TEST(GpuFp8Prefill, StaysWithinFp8RoundingOfTheCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const RunResult cpu = run("cpu");
    const RunResult bf16 = run("bf16");
    const RunResult fp8 = run("fp8");
    const Agreement b = compare(bf16, cpu, 3e-2), f = compare(fp8, cpu, 3e-2);
    for (const auto& [name, r, a] : {std::tuple{"bf16", &bf16, &b}, std::tuple{"fp8", &fp8, &f}})
        std::printf(
            "[ compare ] %s vs cpu: argmax %.4f; row errors median %.3g, p90 %.3g, max %.3g; "
            "frobenius %.3g\n",
            name, a->argmax, row_quantile(*r, cpu, 0.5), row_quantile(*r, cpu, 0.9),
            row_quantile(*r, cpu, 1.0), overall(*r, cpu));
    // The measure: the rows whose router and indexer choices agree with the CPU's.
    // Measured on the H200: bf16 291 of 349 rows, median 0.89%, max 3.8%; fp8 158 rows, median
    // 6.9%, max 11.6% (the issue asks for 3%: not met, docs/fp8.md). Bounds at a few times that.
    for (const auto& [name, r, bound] :
         {std::tuple{"bf16", &bf16, 0.06}, std::tuple{"fp8", &fp8, 0.25}}) {
        const std::vector<bool> same = same_choices(*r, cpu);
        const std::vector<double> e = row_errors_of(*r, cpu);
        std::vector<double> agreeing;
        for (size_t t = 0; t < e.size(); ++t)
            if (same[t]) agreeing.push_back(e[t]);
        std::sort(agreeing.begin(), agreeing.end());
        std::printf(
            "[ compare ] %s vs cpu: %zu of %zu rows choose the same experts and entries; their "
            "row errors median %.3g, max %.3g\n",
            name, agreeing.size(), e.size(), agreeing.empty() ? 0.0 : agreeing[agreeing.size() / 2],
            agreeing.empty() ? 0.0 : agreeing.back());
        EXPECT_GE(agreeing.size(), e.size() / 4) << name;
        if (!agreeing.empty()) {
            EXPECT_LE(agreeing.back(), bound) << name;
        }
    }
    // fp8 activations round each value to 3 mantissa bits: ~2.4% rms per GEMM input (bf16: 0.2%),
    // through ~8 GEMMs per layer, and the indexer's and router's near-ties flip more often.
    // Measured on this model (H200, docs/fp8.md): argmax agreement 0.854 against bf16's 0.960,
    // row errors median 6.9% (bf16 0.94%), p90 25.6% (1.7%). The bounds are a few times the
    // rounding's scale, so that a wrong scale or a lost row (errors of O(1) on every row) fails;
    // the target (2 points of argmax) is not met and is reported as such.
    EXPECT_TRUE(f.err.finite);
    EXPECT_GE(f.argmax, 0.75);
    // The reference with the same activation rounding (docs/fp8.md, "Fidelity": the CPU with it
    // lands as far from fp32 as the GPU's fp8 path does): what is left is the kernels'. Printed
    // until a GPU run has measured it; then bound it like bf16 against fp32.
    const RunResult cpu_fp8 = run("cpu-fp8");
    std::printf(
        "[ compare ] fp8 vs cpu with fp8 activations: argmax %.4f; row errors median %.3g, p90 "
        "%.3g, max %.3g; frobenius %.3g\n",
        compare(fp8, cpu_fp8, 3e-2).argmax, row_quantile(fp8, cpu_fp8, 0.5),
        row_quantile(fp8, cpu_fp8, 0.9), row_quantile(fp8, cpu_fp8, 1.0), overall(fp8, cpu_fp8));
    EXPECT_LE(row_quantile(fp8, cpu, 0.5), 0.10);
    EXPECT_LE(row_quantile(bf16, cpu, 0.5), 0.02);
}

// --indexer: auto gives fp8 weights the fp8 indexer and bf16 weights the bf16 one; bf16 and fp8
// choose it either way. The choice reaches the kernel (the fp8 weights' selections change with it
// on this model: the CPU study changes about a quarter of the sets) and either stays within its
// weights' bounds against the CPU's fp32.
TEST(GpuFp8Prefill, IndexerOptionChoosesTheKernel) {
    CPFILL_SKIP_WITHOUT_SM90();
    const RunResult cpu = run("cpu");
    bool fp8_auto = false, fp8_bf16 = false, bf16_auto = true, bf16_fp8 = false;
    const RunResult a = run("fp8", TboMode::Off, ExpertGemm::Auto, GpuIndexer::Auto, &fp8_auto);
    const RunResult b = run("fp8", TboMode::Off, ExpertGemm::Auto, GpuIndexer::Bf16, &fp8_bf16);
    const RunResult c = run("bf16", TboMode::Off, ExpertGemm::Auto, GpuIndexer::Auto, &bf16_auto);
    const RunResult d = run("bf16", TboMode::Off, ExpertGemm::Auto, GpuIndexer::Fp8, &bf16_fp8);
    EXPECT_TRUE(fp8_auto);
    EXPECT_FALSE(fp8_bf16);
    EXPECT_FALSE(bf16_auto);
    EXPECT_TRUE(bf16_fp8);
    const std::vector<bool> same = same_choices(a, b);
    EXPECT_NE(std::count(same.begin(), same.end(), false), 0)
        << "--indexer bf16 selected what the fp8 indexer did on every row";
    for (const auto& [name, r, median] : {std::tuple{"fp8 weights, bf16 indexer", &b, 0.10},
                                          std::tuple{"bf16 weights, fp8 indexer", &d, 0.02}}) {
        const Agreement g = compare(*r, cpu, 3e-2);
        std::printf("[ compare ] %s vs cpu: argmax %.4f; row errors median %.3g\n", name, g.argmax,
                    row_quantile(*r, cpu, 0.5));
        EXPECT_TRUE(g.err.finite) << name;
        EXPECT_GE(g.argmax, 0.75) << name;
        EXPECT_LE(row_quantile(*r, cpu, 0.5), median) << name;
    }
    (void)c;
}

// What the GPU holds is what the table counts (model/weight_bytes.h), and the fp8 linears of the
// checkpoint re-encode exactly (only fp4 experts may lose values: counted).
TEST(GpuFp8Prefill, GpuBytesEqualTheTable) {
    CPFILL_SKIP_WITHOUT_GPU();
    for (const std::string w : {"bf16", "fp8", "fp4"}) {
        EngineOptions eo;
        eo.threads = 2;
        eo.cuda = true;
        eo.weights = w;
        PrefillEngine engine(checkpoint_dir(), eo);
        const GpuWeightFormat f = parse_gpu_weight_format(w);
        const size_t table = gpu_rank_weight_bytes(engine.config(), {0, 1}, f);
        // fp8: the experts' (row, 128) scales are an upper bound (they may be held in tiles).
        if (f != GpuWeightFormat::Fp8)
            EXPECT_EQ(engine.gpu_weight_stats().bytes, table) << w;
        else
            EXPECT_LE(engine.gpu_weight_stats().bytes, table);
        if (f == GpuWeightFormat::Fp8) {
            EXPECT_GE(engine.gpu_weight_stats().bytes, table * 9 / 10);
        }
        if (f != GpuWeightFormat::Bf16) {
            EXPECT_GT(engine.gpu_weight_stats().fp8_values, 0u);
            std::printf("[ fp8 ] %llu of %llu values inexact\n",
                        static_cast<unsigned long long>(engine.gpu_weight_stats().fp8_inexact),
                        static_cast<unsigned long long>(engine.gpu_weight_stats().fp8_values));
        }
    }
}

// The fp4 experts held packed and re-encoded to fp8 tiles per layer, and the same experts
// re-encoded once at load: the same weights (both exact here), so the same logits bit for bit
// (the scales differ by powers of two only).
TEST(GpuFp8Prefill, Fp4ExpertsEqualFp8Experts) {
    CPFILL_SKIP_WITHOUT_GPU();
    const RunResult fp4 = run("auto"), fp8 = run("fp8");
    ASSERT_EQ(fp4.out.logits.size(), fp8.out.logits.size());
    double worst = 0;
    for (size_t r = 0; r < fp8.out.logits.size(); ++r)
        for (int64_t i = 0; i < fp8.out.logits[r].numel(); ++i)
            worst = std::max(
                worst, std::abs(double(fp4.out.logits[r].f32()[i]) - fp8.out.logits[r].f32()[i]));
    std::printf("[ compare ] fp4 vs fp8 experts: max abs difference %.3g\n", worst);
    EXPECT_EQ(worst, 0.0);
    EXPECT_EQ(fp4.first_tokens, fp8.first_tokens);
}

TEST(GpuFp8Prefill, TboOnEqualsOff) {
    CPFILL_SKIP_WITHOUT_GPU();
    const RunResult on = run("fp8", TboMode::On), off = run("fp8", TboMode::Off);
    ASSERT_TRUE(on.out.tbo_used);
    const Agreement a = compare(on, off, 2e-2);
    std::printf("[ compare ] fp8 TBO on vs off: argmax %.4f, %lld of %lld rows over 2e-2, %.3g\n",
                a.argmax, static_cast<long long>(a.err.outliers),
                static_cast<long long>(a.err.rows), a.err.frob);
    // A schedule change: every row to bf16 rounding (measured: bit-identical).
    EXPECT_LE(a.err.frob, 1e-2);
    EXPECT_EQ(a.err.outliers, 0);
    for (const double e : row_errors_of(on, off)) EXPECT_LE(e, 1e-2);
    EXPECT_EQ(on.first_tokens, off.first_tokens);
}

// The routed experts through the grouped fp8 kernel (`auto` on an H200 for short batches) and
// through a cuBLASLt GEMM pair per expert: the same products, other kernels.
TEST(GpuFp8Prefill, GroupedExpertsEqualPerExpertGemms) {
    CPFILL_SKIP_WITHOUT_SM90();
    for (const std::string weights : {"fp8", "auto"}) {
        const RunResult grouped = run(weights, TboMode::Off, ExpertGemm::Grouped);
        const RunResult streams = run(weights, TboMode::Off, ExpertGemm::Streams);
        const int layers = static_cast<int>(grouped.out.routes.size());
        ASSERT_GT(layers, 0);
        ASSERT_EQ(grouped.gpu.grouped_fp8_layers, layers) << weights << ": not every layer grouped";
        ASSERT_EQ(streams.gpu.grouped_fp8_layers, 0) << weights;
        const std::vector<bool> same = same_choices(grouped, streams);
        const std::vector<double> e = row_errors_of(grouped, streams);
        double worst = 0, worst_any = 0;
        size_t agreeing = 0;
        for (size_t t = 0; t < e.size(); ++t) {
            worst_any = std::max(worst_any, e[t]);
            if (!same[t]) continue;
            ++agreeing;
            worst = std::max(worst, e[t]);
        }
        std::printf(
            "[ compare ] %s grouped vs per-expert GEMMs: %zu of %zu rows choose the same; their "
            "worst row error %.3g (all rows %.3g)\n",
            weights.c_str(), agreeing, e.size(), worst, worst_any);
        // The same per-128 partial sums promoted in the same order: every row's choices and
        // logits agree (measured: bit-identical on all 349 rows).
        EXPECT_EQ(agreeing, e.size()) << weights;
        EXPECT_LE(worst_any, 1e-2) << weights;
    }
}

// bf16 experts through the grouped kernel (grouped_gemm_bf16, dense rows) and through a cuBLASLt
// GEMM pair per expert: the same products, other kernels. Every row's choices and logits agree to
// bf16 rounding (measured on the H200: bit-identical on all 349 rows, session 28 runs 2-6).
TEST(GpuFp8Prefill, GroupedBf16ExpertsEqualPerExpertGemms) {
    CPFILL_SKIP_WITHOUT_SM90();
    const RunResult grouped = run("bf16", TboMode::Off, ExpertGemm::Grouped);
    const RunResult streams = run("bf16", TboMode::Off, ExpertGemm::Streams);
    const int layers = static_cast<int>(grouped.out.routes.size());
    ASSERT_GT(layers, 0);
    ASSERT_EQ(grouped.gpu.grouped_bf16_layers, layers) << "not every layer grouped";
    ASSERT_EQ(streams.gpu.grouped_bf16_layers, 0);
    const std::vector<bool> same = same_choices(grouped, streams);
    const std::vector<double> e = row_errors_of(grouped, streams);
    double worst = 0;
    size_t agreeing = 0;
    for (size_t t = 0; t < e.size(); ++t) {
        if (!same[t]) continue;
        ++agreeing;
        worst = std::max(worst, e[t]);
    }
    std::printf(
        "[ compare ] bf16 grouped vs per-expert GEMMs: %zu of %zu rows choose the same; their "
        "worst row error %.3g\n",
        agreeing, e.size(), worst);
    EXPECT_EQ(agreeing, e.size());
    EXPECT_LE(worst, 1e-2);
}

}  // namespace
}  // namespace cpfill
