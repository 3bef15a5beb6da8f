// EngineOptions::residual = bf16 (`--residual bf16`): the CPU backend with the mHC residual h
// rounded to bf16 after the embedding and after every update, as the release's reference inference
// keeps it (and the GPUs then store it), on the fp8
// fidelity fixture (the checkpoint and requests docs/fp8.md measures the GPU's bf16 and fp8 paths
// on). It prints how far that rounding alone moves the fp32 logits, and, with fp8 activations on
// both sides, what it adds to the fp8 path (docs/numerics.md, "The residual in bf16"); it checks
// that the rounding acts, at the size of bf16's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "../io/io_test_util.h"
#include "engine/prefill_engine.h"
#include "fp8_fixture.h"
#include "io/random_checkpoint.h"
#include "logits_diff.h"

namespace cpfill {
namespace {

RunResult run_cpu(const std::string& dir, bool bf16_residual, bool fp8_activations) {
    EngineOptions eo;
    eo.threads = 2;
    eo.residual = bf16_residual ? ResidualDtype::Bf16 : ResidualDtype::Fp32;
    eo.activations = fp8_activations ? ActRounding::Fp8 : ActRounding::None;
    PrefillEngine engine(dir, eo);
    RunOptions o;
    o.all_logits = true;
    return engine.run(test::fp8_fixture_requests(), o);
}

test::LogitsDiff print_diff(const char* what, const RunResult& got, const RunResult& ref) {
    test::LogitsDiff d;
    test::diff_logits(got.out.logits, ref.out.logits, &d);
    if (d.rows == 0) return d;
    std::printf(
        "[ study ] %s: argmax %.4f; row errors median %.3g, p90 %.3g, max %.3g; frobenius %.3g\n",
        what, d.argmax(), d.median(), d.p90(), d.row_err.back(), d.frobenius());
    return d;
}

TEST(Bf16Residual, MovesTheCpuLogitsByBf16Rounding) {
    test::TempDir dir;
    test::write_fp8_fixture(dir.path().string());
    const RunResult ref = run_cpu(dir.path().string(), false, false);
    const RunResult res = run_cpu(dir.path().string(), true, false);
    test::LogitsDiff d;
    ASSERT_NO_FATAL_FAILURE(d = print_diff("cpu bf16 residual vs fp32", res, ref));
    ASSERT_GT(d.rows, 0);
    // bf16 keeps 8 bits: each rounding moves a value by at most 2^-9 of it, and h is rounded
    // 2 · layers + 1 times. A rounding that did nothing, or one far coarser, fails here.
    EXPECT_TRUE(d.any_differ);
    EXPECT_GT(d.frobenius(), 1e-4);
    EXPECT_LE(d.median(), 0.02);

    // The same rounding beside fp8 activations: what it would add to the fp8 path.
    const RunResult fp8 = run_cpu(dir.path().string(), false, true);
    const RunResult both = run_cpu(dir.path().string(), true, true);
    test::LogitsDiff f, b;
    ASSERT_NO_FATAL_FAILURE(f = print_diff("cpu fp8 activations vs fp32", fp8, ref));
    ASSERT_NO_FATAL_FAILURE(
        b = print_diff("cpu fp8 activations + bf16 residual vs fp32", both, ref));
    EXPECT_TRUE(b.any_differ);
}

// With depth: the fixture's widths with 4 layers and with V4-Flash's 43 (sliding, sliding, then
// CSA and HCA alternating; hash routing on layers 0-2), one random f32 checkpoint each, 2 requests
// of 96 tokens. On a random deep model every bf16-sized perturbation grows (router and indexer
// near-ties flip and the flips compound): measured at 43 layers, the bf16 residual moves the
// logits by 21.7% (median row) and the bf16 rounding of the linears' inputs, which the GPU's bf16
// path already does, by 23.8%; fp32 summation order alone (CP = 2 against 1) by 2.8e-6. So the
// claim checked is relative: at each depth the bf16 residual costs no more than 1.5× what bf16
// activations cost (docs/numerics.md, "The residual in bf16").
TEST(Bf16Residual, CostsNoMoreThanBf16ActivationsAtAnyDepth) {
    for (const int layers : {4, 43}) {
        ModelConfig c = test::fp8_fixture_config();
        c.n_layers = layers;
        c.layer_types.clear();
        c.mlp_types.clear();
        for (int i = 0; i < layers; ++i) {
            c.layer_types.push_back(i < 2 ? AttnType::Sliding
                                          : (i % 2 == 0 ? AttnType::CSA : AttnType::HCA));
            c.mlp_types.push_back(i < 3 ? MlpType::Hash : MlpType::Learned);
        }
        test::TempDir dir;
        RandomCheckpointOptions o;
        o.seed = 17;
        o.threads = 2;
        write_random_checkpoint(c, dir.path().string(), o);
        std::vector<std::vector<int32_t>> req(2, std::vector<int32_t>(96));
        for (size_t r = 0; r < req.size(); ++r)
            for (size_t t = 0; t < req[r].size(); ++t)
                req[r][t] = static_cast<int32_t>((r * 131 + t * 37 + 5) % c.vocab_size);
        const auto run = [&](ResidualDtype residual, ActRounding act) {
            EngineOptions eo;
            eo.threads = 2;
            eo.residual = residual;
            eo.activations = act;
            PrefillEngine engine(dir.path().string(), eo);
            RunOptions ro;
            ro.all_logits = true;
            return engine.run(req, ro);
        };
        const RunResult ref = run(ResidualDtype::Fp32, ActRounding::None);
        const std::string a = fmt::format("cpu bf16 residual vs fp32, {} layers", layers);
        const std::string b = fmt::format("cpu bf16 activations vs fp32, {} layers", layers);
        test::LogitsDiff res, act;
        ASSERT_NO_FATAL_FAILURE(
            res = print_diff(a.c_str(), run(ResidualDtype::Bf16, ActRounding::None), ref));
        ASSERT_NO_FATAL_FAILURE(
            act = print_diff(b.c_str(), run(ResidualDtype::Fp32, ActRounding::Bf16), ref));
        ASSERT_GT(res.rows, 0);
        EXPECT_TRUE(res.any_differ && act.any_differ) << layers << " layers";
        EXPECT_LE(res.median(), 1.5 * act.median()) << layers << " layers";
    }
}

TEST(Bf16Residual, NamesParseAndUnknownOnesAreRefused) {
    EXPECT_EQ(parse_residual_dtype("fp32"), ResidualDtype::Fp32);
    EXPECT_EQ(parse_residual_dtype("bf16"), ResidualDtype::Bf16);
    EXPECT_STREQ(residual_dtype_name(ResidualDtype::Bf16), "bf16");
    try {
        parse_residual_dtype("fp16");
        FAIL() << "expected an error";
    } catch (const std::exception& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("fp16"), std::string::npos) << m;
        EXPECT_NE(m.find("fp32 or bf16"), std::string::npos) << m;
    }
}

}  // namespace
}  // namespace cpfill
