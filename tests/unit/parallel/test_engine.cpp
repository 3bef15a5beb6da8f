// The one engine (parallel/engine.h) and the decoder block (model/decoder_block.h) driven through a
// backend that records every call: the order of a block's ops and exchanges, the TBO stage
// alternation X(a) X(b) Y(a) Y(b), the fused residual + collapse points, and what a chunked plan
// runs. Both backends run exactly this sequence, so a change here is a change of both.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fmt/format.h"
#include "io/presets.h"
#include "parallel/engine.h"
#include "parallel/exchange_plan.h"

namespace cpfill {
namespace {

const char* site_name(Site s) { return s == Site::Attn ? "attn" : "ffn"; }
const char* ex_name(Exchange e) {
    return e == Exchange::AttnInputs ? "attn_in" : e == Exchange::MoeInputs ? "moe_in" : "moe_sum";
}

// Records "op s layer …" per call; residual_collapse is recorded as itself (not split), so a
// backend that fuses sees exactly these points.
class Recorder final : public RankBackend {
  public:
    std::vector<std::string> log;
    void begin_chunk(const ChunkPlan& c) override {
        log.push_back(fmt::format("chunk {} subs {}", c.stream_row0, c.subs.size()));
    }
    void embedded(int s) override { log.push_back(fmt::format("embedded {}", s)); }
    void begin_layer(int l) override { log.push_back(fmt::format("layer {}", l)); }
    void begin_head() override { log.push_back("begin_head"); }
    void head(int s) override { log.push_back(fmt::format("head {}", s)); }
    void end_chunk() override { log.push_back("end_chunk"); }
    void collapse(int s, int l, Site site) override {
        log.push_back(fmt::format("collapse {} {} {}", s, l, site_name(site)));
    }
    void residual(int s, int l, Site site) override {
        log.push_back(fmt::format("residual {} {} {}", s, l, site_name(site)));
    }
    void residual_collapse(int s, int l, Site from, int next, Site to) override {
        log.push_back(fmt::format("residual_collapse {} {} {} {} {}", s, l, site_name(from), next,
                                  site_name(to)));
    }
    void attn_pack(int s, int l) override { log.push_back(fmt::format("attn_pack {} {}", s, l)); }
    void attn_queries(int s, int l) override {
        log.push_back(fmt::format("attn_queries {} {}", s, l));
    }
    void kv_append(int s, int l) override { log.push_back(fmt::format("kv_append {} {}", s, l)); }
    void attn_output(int s, int l) override {
        log.push_back(fmt::format("attn_output {} {}", s, l));
    }
    void moe_route(int s, int l) override { log.push_back(fmt::format("moe_route {} {}", s, l)); }
    void moe_experts(int s, int l) override {
        log.push_back(fmt::format("moe_experts {} {}", s, l));
    }
    void start(Exchange e, int s, int l) override {
        log.push_back(fmt::format("start {} {} {}", ex_name(e), s, l));
    }
    void wait(Exchange e, int s, int l) override {
        log.push_back(fmt::format("wait {} {} {}", ex_name(e), s, l));
    }
    void layer_done(int s, int l) override { log.push_back(fmt::format("layer_done {} {}", s, l)); }
};

// The attention stage of sub-batch s at layer l, as the block defines it.
std::vector<std::string> attention_stage_of(int s, int l) {
    std::vector<std::string> v;
    if (l == 0) {
        v.push_back(fmt::format("collapse {} 0 attn", s));
    } else {
        v.push_back(fmt::format("wait moe_sum {} {}", s, l - 1));
        v.push_back(fmt::format("residual_collapse {} {} ffn {} attn", s, l - 1, l));
        v.push_back(fmt::format("layer_done {} {}", s, l - 1));
    }
    for (const char* f : {"attn_pack {} {}", "start attn_in {} {}", "attn_queries {} {}",
                          "wait attn_in {} {}", "kv_append {} {}", "attn_output {} {}"})
        v.push_back(fmt::format(fmt::runtime(f), s, l));
    v.push_back(fmt::format("residual_collapse {} {} attn {} ffn", s, l, l));
    v.push_back(fmt::format("start moe_in {} {}", s, l));
    v.push_back(fmt::format("moe_route {} {}", s, l));
    return v;
}

std::vector<std::string> moe_stage_of(int s, int l) {
    return {fmt::format("wait moe_in {} {}", s, l), fmt::format("moe_experts {} {}", s, l),
            fmt::format("start moe_sum {} {}", s, l)};
}

std::vector<std::string> expected_chunk(int64_t row0, int subs, int layers) {
    std::vector<std::string> v{fmt::format("chunk {} subs {}", row0, subs)};
    for (int s = 0; s < subs; ++s) v.push_back(fmt::format("embedded {}", s));
    for (int l = 0; l < layers; ++l) {
        v.push_back(fmt::format("layer {}", l));
        for (int s = 0; s < subs; ++s)
            for (auto& x : attention_stage_of(s, l)) v.push_back(x);
        for (int s = 0; s < subs; ++s)
            for (auto& x : moe_stage_of(s, l)) v.push_back(x);
    }
    for (int s = 0; s < subs; ++s) {
        v.push_back(fmt::format("wait moe_sum {} {}", s, layers - 1));
        v.push_back(fmt::format("residual {} {} ffn", s, layers - 1));
        v.push_back(fmt::format("layer_done {} {}", s, layers - 1));
    }
    v.push_back("begin_head");
    for (int s = 0; s < subs; ++s) v.push_back(fmt::format("head {}", s));
    v.push_back("end_chunk");
    return v;
}

void expect_log(const std::vector<std::string>& got, const std::vector<std::string>& want) {
    const size_t n = std::min(got.size(), want.size());
    for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], want[i]) << "call " << i << " of " << got.size();
    EXPECT_EQ(got.size(), want.size());
}

TEST(Engine, OneSubBatchRunsTheBlockInOrder) {
    const ModelConfig cfg = preset_config("tiny");
    const std::vector<std::vector<int32_t>> req{std::vector<int32_t>(100, 3)};
    const RunPlan plan = make_run_plan(req, cfg, 2, TboMode::Off, 0, tbo_pays);
    Recorder r;
    run_plan(r, plan, 3);
    expect_log(r.log, expected_chunk(0, 1, 3));
}

// X(a) X(b) Y(a) Y(b): each sub-batch's exchanges are in flight while the other computes.
TEST(Engine, TwoBatchOverlapAlternatesTheStages) {
    const ModelConfig cfg = preset_config("tiny");
    const std::vector<std::vector<int32_t>> req{std::vector<int32_t>(100, 3),
                                                std::vector<int32_t>(60, 5)};
    const RunPlan plan = make_run_plan(req, cfg, 2, TboMode::On, 0, tbo_pays);
    ASSERT_EQ(plan.chunks.size(), 1u);
    ASSERT_EQ(plan.chunks[0].subs.size(), 2u);
    Recorder r;
    run_plan(r, plan, 2);
    expect_log(r.log, expected_chunk(0, 2, 2));
}

TEST(Engine, ChunksRunOneAfterAnotherEachWithItsSplit) {
    const ModelConfig cfg = preset_config("tiny");
    const std::vector<std::vector<int32_t>> req{std::vector<int32_t>(250, 3)};
    const RunPlan plan = make_run_plan(req, cfg, 1, TboMode::On, 100, tbo_pays);
    ASSERT_EQ(plan.chunks.size(), 3u);  // 100, 100, 50 tokens
    Recorder r;
    run_plan(r, plan, 1);
    std::vector<std::string> want;
    for (int64_t row0 : {0, 100, 200})
        for (auto& x : expected_chunk(row0, 2, 1)) want.push_back(x);
    expect_log(r.log, want);
}

// Without an override, residual_collapse is the residual update, then the collapse.
TEST(Engine, ResidualCollapseDefaultsToTheTwoOps) {
    class Split final : public BlockOps {
      public:
        std::vector<std::string> log;
        void collapse(int s, int l, Site site) override {
            log.push_back(fmt::format("collapse {} {} {}", s, l, site_name(site)));
        }
        void residual(int s, int l, Site site) override {
            log.push_back(fmt::format("residual {} {} {}", s, l, site_name(site)));
        }
        void attn_pack(int, int) override {}
        void attn_queries(int, int) override {}
        void kv_append(int, int) override {}
        void attn_output(int, int) override {}
        void moe_experts(int, int) override {}
        void start(Exchange, int, int) override {}
        void wait(Exchange, int, int) override {}
    } b;
    attention_stage(b, 1, 4);
    expect_log(b.log,
               {"residual 1 3 ffn", "collapse 1 4 attn", "residual 1 4 attn", "collapse 1 4 ffn"});
}

TEST(ExchangePlan, CollectivesAndWidths) {
    const ModelConfig cfg = preset_config("flash-slice");
    EXPECT_EQ(collective_of(Exchange::AttnInputs), Collective::AllGather);
    EXPECT_EQ(collective_of(Exchange::MoeInputs), Collective::AllGather);
    EXPECT_EQ(collective_of(Exchange::MoeSums), Collective::ReduceScatter);
    // [key | C | Z | C_idx | Z_idx]: CSA compresses with overlap (2 · head_dim) and has the
    // indexer's (2 · index_head_dim); HCA one head_dim; sliding only the key.
    const int64_t d = cfg.head_dim, dI = cfg.index_head_dim;
    EXPECT_EQ(exchange_width(cfg, AttnType::Sliding, Exchange::AttnInputs), d);
    EXPECT_EQ(exchange_width(cfg, AttnType::HCA, Exchange::AttnInputs), 3 * d);
    EXPECT_EQ(exchange_width(cfg, AttnType::CSA, Exchange::AttnInputs), d + 4 * d + 4 * dI);
    EXPECT_EQ(exchange_width(cfg, AttnType::CSA, Exchange::MoeInputs), cfg.d_model);
    EXPECT_EQ(exchange_width(cfg, AttnType::HCA, Exchange::MoeSums), cfg.d_model);
}

}  // namespace
}  // namespace cpfill
