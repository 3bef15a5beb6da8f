// EngineOptions::activations = Fp8: the CPU backend with the CUDA backend's fp8 activation rounding
// (ops/act_rounding.h), on the checkpoint and requests of tests/cuda/test_gpu_fp8_prefill.cpp
// (upstream fp8 + fp4, tiny with 16 indexer heads). It prints how far the rounding alone moves the
// fp32 logits (docs/fp8.md, "Fidelity": the GPU's fp8 path against this run separates the format
// from the kernels) and checks that the rounding acts, and acts at the size of e4m3's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "../io/io_test_util.h"
#include "engine/prefill_engine.h"
#include "fp8_fixture.h"
#include "logits_diff.h"

namespace cpfill {
namespace {

RunResult run_cpu(const std::string& dir, bool fp8_activations) {
    EngineOptions eo;
    eo.threads = 2;
    eo.activations = fp8_activations ? ActRounding::Fp8 : ActRounding::None;
    PrefillEngine engine(dir, eo);
    RunOptions o;
    o.all_logits = true;
    return engine.run(test::fp8_fixture_requests(), o);
}

TEST(Fp8Activations, MoveTheCpuLogitsByE4m3Rounding) {
    test::TempDir dir;
    test::write_fp8_fixture(dir.path().string());
    const RunResult ref = run_cpu(dir.path().string(), false);
    const RunResult fp8 = run_cpu(dir.path().string(), true);
    test::LogitsDiff d;
    ASSERT_NO_FATAL_FAILURE(test::diff_logits(fp8.out.logits, ref.out.logits, &d));
    const double median = d.median(), frob = d.frobenius();
    std::printf(
        "[ study ] cpu fp8 activations vs fp32: argmax %.4f; row errors median %.3g, p90 %.3g, "
        "max %.3g; frobenius %.3g\n",
        d.argmax(), median, d.p90(), d.row_err.back(), frob);
    // e4m3 keeps 3 mantissa bits: each rounded input is off by up to 6%, ≈ 2.4% rms, and the
    // errors compound over the layers; a rounding that did nothing, or far more, fails here.
    EXPECT_GT(frob, 5e-3);
    EXPECT_LE(median, 0.10);
}

// The rounding is the CPU's imitation of the GPU's fp8 path: asked of the GPU backend, a clear
// error before anything is loaded.
TEST(Fp8Activations, AreRefusedOnTheGpuBackend) {
    test::TempDir dir;
    test::write_fp8_fixture(dir.path().string());
    EngineOptions eo;
    eo.cuda = true;
    eo.activations = ActRounding::Fp8;
    try {
        PrefillEngine engine(dir.path().string(), eo);
        FAIL() << "expected an error";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("--weights fp8"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace cpfill
