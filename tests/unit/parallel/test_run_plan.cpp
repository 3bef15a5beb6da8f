// The run plan both backends execute (parallel/run_plan.h): how a batch is cut into chunks and
// sub-batches, and which rule decides `--tbo auto`.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/presets.h"
#include "parallel/run_plan.h"

namespace cpfill {
namespace {

std::vector<std::vector<int32_t>> requests_of(const std::vector<int64_t>& lengths) {
    std::vector<std::vector<int32_t>> r;
    for (int64_t n : lengths) r.emplace_back(n, 3);
    return r;
}

// Every token of the stream in exactly one chunk, in order; each chunk's sub-batches cover it.
void expect_covers(const RunPlan& p, int64_t total) {
    int64_t row = 0;
    for (const ChunkPlan& c : p.chunks) {
        EXPECT_EQ(c.stream_row0, row);
        int64_t in_subs = 0;
        ASSERT_EQ(c.subs.size(), c.row_offset.size());
        for (size_t i = 0; i < c.subs.size(); ++i) {
            EXPECT_EQ(c.row_offset[i], in_subs);
            in_subs += c.subs[i].n_tokens();
        }
        EXPECT_EQ(in_subs, c.batch.n_tokens());
        EXPECT_EQ(c.subs.size(), c.tbo ? 2u : 1u);
        row += c.batch.n_tokens();
    }
    EXPECT_EQ(row, total);
    EXPECT_EQ(p.n_tokens, total);
}

TEST(RunPlan, ChunksCoverTheStreamEachWithItsOwnSplit) {
    const ModelConfig cfg = preset_config("tiny");
    const auto req = requests_of({300, 50, 676});  // 1026 tokens: chunks of 256, the last 2
    const RunPlan p = make_run_plan(req, cfg, 1, TboMode::On, 256, gpu_tbo_rule);
    ASSERT_EQ(p.chunks.size(), 5u);
    EXPECT_EQ(p.chunk, 256);
    EXPECT_TRUE(p.tbo());
    expect_covers(p, 1026);
    // The second chunk continues request 0 (positions 256 … 299), then holds request 1 whole and
    // the start of request 2.
    const Batch& b = p.chunks[1].batch;
    ASSERT_GE(b.segments.size(), 3u);
    EXPECT_EQ(b.segments[0].request, 0);
    EXPECT_EQ(b.segments[0].pos0, 256);
    EXPECT_EQ(b.segments[1].request, 1);
    EXPECT_EQ(b.segments[1].pos0, 0);
    EXPECT_EQ(b.segments[2].request, 2);
    // A chunk of one token is never split.
    const RunPlan q = make_run_plan(requests_of({257}), cfg, 1, TboMode::On, 256, gpu_tbo_rule);
    ASSERT_EQ(q.chunks.size(), 2u);
    EXPECT_FALSE(q.chunks[1].tbo);
    expect_covers(q, 257);
}

TEST(RunPlan, OneChunkIsOnePass) {
    const ModelConfig cfg = preset_config("tiny");
    const auto req = requests_of({100, 20});
    for (int64_t chunk : {0, 120, 4096}) {
        const RunPlan p = make_run_plan(req, cfg, 2, TboMode::Off, chunk, gpu_tbo_rule);
        ASSERT_EQ(p.chunks.size(), 1u) << chunk;
        EXPECT_EQ(p.chunk, 0) << chunk;
        EXPECT_FALSE(p.tbo());
        expect_covers(p, 120);
    }
}

bool always(const ModelConfig&, int64_t, int) { return true; }
bool never(const ModelConfig&, int64_t, int) { return false; }

TEST(RunPlan, AutoAsksTheBackendsRuleOnOffDoNot) {
    const ModelConfig cfg = preset_config("tiny");
    const auto req = requests_of({300, 50});
    EXPECT_TRUE(make_run_plan(req, cfg, 2, TboMode::Auto, 0, always).tbo());
    EXPECT_FALSE(make_run_plan(req, cfg, 2, TboMode::Auto, 0, never).tbo());
    EXPECT_TRUE(make_run_plan(req, cfg, 2, TboMode::On, 0, never).tbo());
    EXPECT_FALSE(make_run_plan(req, cfg, 2, TboMode::Off, 0, always).tbo());
    // The CPU rule splits only with ≥ 2 ranks and ≥ 256 tokens per sub-batch.
    EXPECT_FALSE(make_run_plan(req, cfg, 1, TboMode::Auto, 0, tbo_pays).tbo());
    EXPECT_FALSE(make_run_plan(req, cfg, 2, TboMode::Auto, 0, tbo_pays).tbo());
    EXPECT_TRUE(make_run_plan(requests_of({600}), cfg, 2, TboMode::Auto, 0, tbo_pays).tbo());
}

TEST(RunPlan, RefusesInvalidRequests) {
    const ModelConfig cfg = preset_config("tiny");
    std::vector<std::vector<int32_t>> bad{{1, 2, static_cast<int32_t>(cfg.vocab_size)}};
    EXPECT_THROW(make_run_plan(bad, cfg, 1, TboMode::Off, 0, tbo_pays), Error);
    std::vector<std::vector<int32_t>> empty{{}};
    EXPECT_THROW(make_run_plan(empty, cfg, 1, TboMode::Off, 0, tbo_pays), Error);
}

}  // namespace
}  // namespace cpfill
