// EngineOptions::indexer_rounding: the CPU backend with the lightning indexer's queries and keys
// rounded as a low-precision indexer kernel would read them (ops/indexer_round.h: fp8 blocks of
// 128, or the release's Hadamard + fp4 blocks of 32), on the fp8 fidelity fixture (upstream fp8 +
// fp4, tiny with 16 indexer heads, requests of 207 and 142 tokens). It prints how many of the fp32
// run's top-k selections each rounding keeps and how far the logits move (docs/fp8.md, "The
// indexer's queries and keys rounded"), and checks that the rounding acts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "../io/io_test_util.h"
#include "engine/prefill_engine.h"
#include "fp8_fixture.h"
#include "logits_diff.h"

namespace cpfill {
namespace {

RunResult run_cpu(const std::string& dir, IndexerRounding rounding) {
    EngineOptions eo;
    eo.threads = 2;
    eo.indexer_rounding = rounding;
    PrefillEngine engine(dir, eo);
    RunOptions o;
    o.all_logits = true;
    o.record_topk = true;
    return engine.run(test::fp8_fixture_requests(), o);
}

struct Overlap {
    int64_t sparse_pairs = 0;      // (query, CSA layer) pairs with more eligible entries than top-k
    double kept = 0;               // mean |S_rounded ∩ S_fp32| / |S_fp32| over them
    double unchanged = 0;          // fraction of them whose whole set is the same
    bool any_set_differs = false;  // over all pairs, dense ones included
};

// Selections of `b` against the reference `a`, per (query, CSA layer). A query at position p of
// its request sees min((p + 1) / csa_ratio, entries) entries; it selects among them only when
// they outnumber index_topk (docs/architecture.md §3.7, step 5), else it takes them all.
Overlap compare_topk(const ModelConfig& cfg, const PrefillOutput& a, const PrefillOutput& b) {
    Overlap o;
    const int64_t K = cfg.index_topk;
    for (size_t li = 0; li < a.topk.size(); ++li) {
        if (!a.topk[li].defined()) continue;
        const Tensor &ta = a.topk[li], &tb = b.topk[li];
        int64_t row = 0;
        for (const std::vector<int32_t>& req : test::fp8_fixture_requests()) {
            const int64_t len = static_cast<int64_t>(req.size());
            for (int64_t p = 0; p < len; ++p, ++row) {
                const int32_t* sa = ta.data<int32_t>() + row * K;
                const int32_t* sb = tb.data<int32_t>() + row * K;
                std::set<int32_t> A, B;
                for (int64_t j = 0; j < K; ++j) {
                    if (sa[j] >= 0) A.insert(sa[j]);
                    if (sb[j] >= 0) B.insert(sb[j]);
                }
                o.any_set_differs |= A != B;
                const int64_t eligible = (p + 1) / cfg.csa_ratio;  // p < len: never past the pool
                if (eligible <= K) continue;
                int64_t both = 0;
                for (int32_t e : B) both += A.count(e);
                ++o.sparse_pairs;
                o.kept += double(both) / double(A.size());
                o.unchanged += A == B;
            }
        }
    }
    if (o.sparse_pairs > 0) {
        o.kept /= double(o.sparse_pairs);
        o.unchanged /= double(o.sparse_pairs);
    }
    return o;
}

TEST(IndexerRounding, KeepsMostTopkSelections) {
    test::TempDir dir;
    test::write_fp8_fixture(dir.path().string());
    const ModelConfig cfg = test::fp8_fixture_config();
    // None runs the same code as a run without the option (round_indexer_rows returns at once),
    // so it is the fp32 reference.
    const RunResult ref = run_cpu(dir.path().string(), IndexerRounding::None);
    for (IndexerRounding r : {IndexerRounding::Fp8, IndexerRounding::Fp4Hadamard}) {
        const RunResult run = run_cpu(dir.path().string(), r);
        ASSERT_EQ(run.out.topk.size(), ref.out.topk.size());
        const Overlap o = compare_topk(cfg, ref.out, run.out);
        test::LogitsDiff d;
        ASSERT_NO_FATAL_FAILURE(test::diff_logits(run.out.logits, ref.out.logits, &d));
        std::printf(
            "[ study ] cpu indexer %s vs fp32: top-k kept %.4f, sets unchanged %.4f over %lld "
            "sparse (query, CSA layer) pairs; logits row errors median %.3g, p90 %.3g; argmax "
            "%.4f\n",
            ops::indexer_rounding_name(r), o.kept, o.unchanged,
            static_cast<long long>(o.sparse_pairs), d.median(), d.p90(), d.argmax());
        // The fixture reaches sparsity (tiny's index_topk 16: from position 4 · 16 + 3 on).
        EXPECT_GT(o.sparse_pairs, 0);
        EXPECT_GE(o.kept, 0.0);
        EXPECT_LE(o.kept, 1.0);
        // A rounding that did nothing would leave every selection and every logit as they were.
        EXPECT_TRUE(o.any_set_differs || d.any_differ) << ops::indexer_rounding_name(r);
    }
}

// The rounding is a CPU study: asked of the GPU backend, a clear error before anything is loaded.
TEST(IndexerRounding, IsRefusedOnTheGpuBackend) {
    test::TempDir dir;
    test::write_fp8_fixture(dir.path().string());
    EngineOptions eo;
    eo.cuda = true;
    eo.indexer_rounding = IndexerRounding::Fp4Hadamard;
    try {
        PrefillEngine engine(dir.path().string(), eo);
        FAIL() << "expected an error";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("fp4-hadamard"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("expected none"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace cpfill
