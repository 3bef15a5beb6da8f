// The bench report: the FLOP model against sums done by hand on a tiny config and against the
// per-token figures of docs/architecture.md §5.1; the derived ratios (MFU, CP speed-up, exposed
// communication, full-model projection); the JSON round trip; the SVG's structure and escaping.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/bench_report.h"
#include "io/presets.h"

namespace cpfill {
namespace {

// Small enough to sum by hand. Per token: D=4, H=2, d=4, q_rank=2, o_groups=1, o_rank=2, hc=1,
// n_I=1, d_I=2, E=4, top_k=1 (+1 shared), moe_dim=2, V=10; window 3, CSA ratio 2 (top 1), HCA 4.
ModelConfig hand_config() {
    ModelConfig c;
    c.vocab_size = 10;
    c.d_model = 4;
    c.n_layers = 3;
    c.n_heads = 2;
    c.head_dim = 4;
    c.rope_dim = 2;
    c.q_rank = 2;
    c.o_groups = 1;
    c.o_rank = 2;
    c.window = 3;
    c.n_experts = 4;
    c.top_k = 1;
    c.n_shared_experts = 1;
    c.moe_dim = 2;
    c.hc = 1;
    c.index_n_heads = 1;
    c.index_head_dim = 2;
    c.index_topk = 1;
    c.csa_ratio = 2;
    c.hca_ratio = 4;
    c.layer_types = {AttnType::Sliding, AttnType::CSA, AttnType::HCA};
    c.mlp_types = {MlpType::Hash, MlpType::Learned, MlpType::Learned};
    return c;
}

// L = 5 tokens, t = 0..4:
//   mHC per site per token: fn 2·(2+1)·1·1·4 = 24, collapse 2·1·4 = 8, post 8, comb 2·1·4 = 8
//     → 48; 2 sites → 96 per token → 480.
//   projections per token: 2·4·2 + 2·2·2·4 + 2·4·4 + 2·2·4·2 + 2·1·2·4 = 16+32+32+32+16 = 128 →
//   640. window keys min(t+1, 3): 1+2+3+3+3 = 12. HCA entries floor((t+1)/4): 0+0+0+1+1 = 2. CSA
//   eligible floor((t+1)/2): 0+1+1+2+2 = 6 scored; selected min(1, ·): 0+1+1+1+1 = 4. 4·H·d = 32
//   per key: sliding 32·12 = 384, HCA 32·14 = 448, CSA 32·16 = 512. compressor per token: HCA
//   2·2·4·4 = 64 → 320; CSA 2·2·4·8 = 128 → 640. indexer fixed per token: 2·2·1·2 + 2·4·1 + 2·2·4·4
//   = 8+8+64 = 80 → 400; scoring 2·1·2·6 = 24. MoE per token: 6·4·2·(1+1) + 2·4·4 = 96+32 = 128 →
//   640. head: 2·4·10 = 80.
TEST(BenchFlops, HandConfigPartByPart) {
    const ModelConfig c = hand_config();
    const LayerFlops s = layer_flops(c, AttnType::Sliding, MlpType::Hash, 5);
    EXPECT_DOUBLE_EQ(s.mhc, 480);
    EXPECT_DOUBLE_EQ(s.attn_proj, 640);
    EXPECT_DOUBLE_EQ(s.core_attention, 384);
    EXPECT_DOUBLE_EQ(s.compressor, 0);
    EXPECT_DOUBLE_EQ(s.indexer_fixed, 0);
    EXPECT_DOUBLE_EQ(s.indexer_scoring, 0);
    EXPECT_DOUBLE_EQ(s.moe, 640);
    EXPECT_DOUBLE_EQ(s.total(), 2144);

    const LayerFlops h = layer_flops(c, AttnType::HCA, MlpType::Learned, 5);
    EXPECT_DOUBLE_EQ(h.core_attention, 448);
    EXPECT_DOUBLE_EQ(h.compressor, 320);
    EXPECT_DOUBLE_EQ(h.indexer_fixed + h.indexer_scoring, 0);
    EXPECT_DOUBLE_EQ(h.total(), 2528);

    const LayerFlops a = layer_flops(c, AttnType::CSA, MlpType::Learned, 5);
    EXPECT_DOUBLE_EQ(a.core_attention, 512);
    EXPECT_DOUBLE_EQ(a.compressor, 640);
    EXPECT_DOUBLE_EQ(a.indexer_fixed, 400);
    EXPECT_DOUBLE_EQ(a.indexer_scoring, 24);
    EXPECT_DOUBLE_EQ(a.total(), 3336);

    EXPECT_DOUBLE_EQ(head_flops(c), 80);
    EXPECT_DOUBLE_EQ(prefill_flops(c, 5), 2144 + 3336 + 2528 + 80);
    // Hash routing still scores every expert: same count.
    EXPECT_DOUBLE_EQ(layer_flops(c, AttnType::CSA, MlpType::Hash, 5).total(), a.total());
}

TEST(BenchFlops, UsesTheConfigsWindowAndRatios) {
    ModelConfig c = hand_config();
    c.window = 1;     // 1 key per query: 5 in all
    c.hca_ratio = 2;  // entries 0+1+1+2+2 = 6
    EXPECT_DOUBLE_EQ(layer_flops(c, AttnType::HCA, MlpType::Learned, 5).core_attention,
                     32 * (5 + 6));
    c.index_topk = 2;  // selected min(2, 0 1 1 2 2) = 6, scored 6
    EXPECT_DOUBLE_EQ(layer_flops(c, AttnType::CSA, MlpType::Learned, 5).core_attention,
                     32 * (5 + 6));
}

// |found − doc| within half a unit of the document's last printed digit.
void expect_mflop(double flops, double doc_mflop, double half_unit) {
    EXPECT_NEAR(flops / 1e6, doc_mflop, half_unit) << "documented " << doc_mflop << " MFLOP";
}

TEST(BenchFlops, PerTokenFiguresOfTheArchitectureDoc) {
    const ModelConfig flash = preset_config("flash"), pro = preset_config("pro");
    const LayerFlops fc = layer_flops(flash, AttnType::CSA, MlpType::Learned, 1);
    const LayerFlops fh = layer_flops(flash, AttnType::HCA, MlpType::Learned, 1);
    EXPECT_NEAR(fc.attn_proj / 213.9e6, 1, 1e-3);
    EXPECT_NEAR(fc.moe / 354.4e6, 1, 1e-3);
    expect_mflop(fc.mhc, 1.97, 0.005);
    expect_mflop(fh.compressor, 8.4, 0.05);
    expect_mflop(fc.compressor, 16.8, 0.05);
    expect_mflop(fc.indexer_fixed, 21.5, 0.05);
    expect_mflop(head_flops(flash), 1059, 0.5);

    const LayerFlops pc = layer_flops(pro, AttnType::CSA, MlpType::Learned, 1);
    const LayerFlops ph = layer_flops(pro, AttnType::HCA, MlpType::Learned, 1);
    EXPECT_NEAR(pc.attn_proj / 599.8e6, 1, 1e-3);
    EXPECT_NEAR(pc.moe / 930.3e6, 1, 1e-3);
    expect_mflop(pc.mhc, 3.44, 0.005);
    expect_mflop(ph.compressor, 14.7, 0.05);
    expect_mflop(pc.compressor, 29.4, 0.05);
    expect_mflop(pc.indexer_fixed, 33.4, 0.05);
    expect_mflop(head_flops(pro), 1853, 0.5);
    // One token attends to itself only: 4·H·d FLOPs, no compressed entry yet.
    EXPECT_DOUBLE_EQ(fc.core_attention, 131072);
    EXPECT_DOUBLE_EQ(pc.core_attention, 262144);
}

// The §5.1 table: GFLOP per token per layer averaged over the prompt (its averages are
// approximations of the exact sums, printed to 3 decimals: half a unit of the last digit plus
// 0.0003 for the approximation).
TEST(BenchFlops, AveragesOfTheArchitectureDocTable) {
    const ModelConfig flash = preset_config("flash"), pro = preset_config("pro");
    struct Entry {
        const ModelConfig* cfg;
        AttnType type;
        int64_t length;
        double gflop_per_token;
    };
    const Entry table[] = {
        {&flash, AttnType::Sliding, 4096, 0.587},   {&flash, AttnType::CSA, 4096, 0.684},
        {&flash, AttnType::HCA, 4096, 0.597},       {&pro, AttnType::CSA, 4096, 1.772},
        {&pro, AttnType::HCA, 4096, 1.585},         {&flash, AttnType::Sliding, 32768, 0.587},
        {&flash, AttnType::CSA, 32768, 0.757},      {&flash, AttnType::HCA, 32768, 0.612},
        {&pro, AttnType::CSA, 32768, 1.949},        {&pro, AttnType::HCA, 32768, 1.615},
        {&flash, AttnType::Sliding, 131072, 0.587}, {&flash, AttnType::CSA, 131072, 0.960},
        {&flash, AttnType::HCA, 131072, 0.662},     {&pro, AttnType::CSA, 131072, 2.163},
        {&pro, AttnType::HCA, 131072, 1.716},       {&flash, AttnType::Sliding, 1048576, 0.587},
        {&flash, AttnType::CSA, 1048576, 2.840},    {&flash, AttnType::HCA, 1048576, 1.132},
        {&pro, AttnType::CSA, 1048576, 4.045},      {&pro, AttnType::HCA, 1048576, 2.656},
    };
    for (const Entry& e : table) {
        const double avg = layer_flops(*e.cfg, e.type, MlpType::Learned, e.length).total() /
                           static_cast<double>(e.length) / 1e9;
        EXPECT_NEAR(avg, e.gflop_per_token, 0.0008)
            << attn_type_name(e.type) << " L=" << e.length << " d_model=" << e.cfg->d_model;
    }
}

TEST(BenchFlops, PrefillIsLayersPlusHead) {
    const ModelConfig c = preset_config("flash-slice");  // sliding, sliding, CSA, HCA
    const int64_t L = 3000;
    const double expected = 2 * layer_flops(c, AttnType::Sliding, MlpType::Hash, L).total() +
                            layer_flops(c, AttnType::CSA, MlpType::Hash, L).total() +
                            layer_flops(c, AttnType::HCA, MlpType::Learned, L).total() +
                            head_flops(c);
    EXPECT_NEAR(prefill_flops(c, L) / expected, 1, 1e-12);
}

TEST(BenchConfig, LayerCountKeepsThePresetsPattern) {
    const ModelConfig flash = preset_config("flash"), pro = preset_config("pro");
    const ModelConfig f8 = with_layer_count(preset_config("flash-slice"), 8);
    EXPECT_EQ(f8.n_layers, 8);
    for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(f8.layer_types[i], flash.layer_types[i]) << "layer " << i;
        EXPECT_EQ(f8.mlp_types[i], flash.mlp_types[i]) << "layer " << i;
    }
    const ModelConfig p7 = with_layer_count(preset_config("pro-slice"), 7);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(p7.layer_types[i], pro.layer_types[i]) << "layer " << i;
    const ModelConfig f2 = with_layer_count(flash, 2);
    EXPECT_EQ(f2.layer_types, (std::vector<AttnType>{AttnType::Sliding, AttnType::Sliding}));
    EXPECT_EQ(f2.mlp_types, (std::vector<MlpType>{MlpType::Hash, MlpType::Hash}));
    EXPECT_THROW(with_layer_count(flash, 0), Error);
}

TEST(BenchMath, MedianAndLengths) {
    EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
    EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
    EXPECT_DOUBLE_EQ(median({}), 0);
    EXPECT_EQ(format_length(8192), "8k");
    EXPECT_EQ(format_length(1 << 20), "1M");
    EXPECT_EQ(format_length(5000), "5000");
}

BenchRow raw_row(int cp, const std::string& tbo, int64_t length, std::vector<double> runs) {
    BenchRow r;
    r.cp = cp;
    r.tbo = tbo;
    r.length = length;
    r.ttft_runs = std::move(runs);
    return r;
}

// flash-slice, 8k: cp=1 (median 0.2 s, per-layer times), cp=2 (median 0.115 s, 0.1 s without
// communication), cp=2 with TBO (no cp=1 TBO row to compare with) and a skipped cp=4 row.
BenchReport sample_report() {
    BenchReport r;
    r.preset = "flash-slice";
    r.config = preset_config("flash-slice");
    r.device = "NVIDIA H200 <test & \"co\">";
    r.gpus = 2;
    r.repeat = 3;
    r.warmup = 1;
    r.seed = 7;
    r.indexer = "bf16";
    r.ceilings = BenchCeilings{790, 0, 4200, 260, 2};
    r.rows.push_back(raw_row(1, "off", 8192, {0.3, 0.1, 0.2}));
    r.rows.back().layer_seconds = {0.01, 0.03, 0.05, 0.04};  // sliding, sliding, CSA, HCA
    r.rows.back().phases = {0.05, 0.01, 0.01, 0.1, 0, 0.03};
    r.rows.back().peak_bytes = 20'000'000'000ull;
    r.rows.push_back(raw_row(2, "off", 8192, {0.12, 0.11}));
    r.rows.back().no_comm_runs = {0.1, 0.1, 0.1};
    r.rows.push_back(raw_row(2, "on", 8192, {0.1}));
    r.rows.back().tbo_used = true;
    r.rows.push_back(raw_row(4, "off", 8192, {}));
    r.rows.back().skipped = "needs 4 GPUs, 2 visible";
    finalize_report(r);
    return r;
}

TEST(BenchMath, MfuSpeedupExposed) {
    const BenchReport r = sample_report();
    const double flops = prefill_flops(r.config, 8192);
    const BenchRow &one = r.rows[0], &two = r.rows[1], &tbo = r.rows[2], &skip = r.rows[3];
    EXPECT_DOUBLE_EQ(one.ttft, 0.2);
    EXPECT_DOUBLE_EQ(one.flops, flops);
    EXPECT_DOUBLE_EQ(one.tokens_per_s, 8192 / 0.2);
    EXPECT_DOUBLE_EQ(one.mfu, flops / (989e12 * 1 * 0.2));
    EXPECT_DOUBLE_EQ(*one.speedup, 1);
    EXPECT_FALSE(one.exposed);  // cp = 1: nothing to expose

    EXPECT_DOUBLE_EQ(two.ttft, 0.115);
    EXPECT_DOUBLE_EQ(two.tokens_per_s_per_gpu, 8192 / 0.115 / 2);
    EXPECT_DOUBLE_EQ(two.mfu, flops / (989e12 * 2 * 0.115));
    EXPECT_DOUBLE_EQ(*two.speedup, 0.2 / 0.115);
    EXPECT_DOUBLE_EQ(*two.ttft_no_comm, 0.1);
    EXPECT_NEAR(*two.exposed, 0.15, 1e-12);

    EXPECT_FALSE(tbo.speedup);  // no cp=1 row with TBO on
    EXPECT_FALSE(tbo.exposed);  // no run without communication
    EXPECT_FALSE(skip.measured());
    EXPECT_FALSE(skip.speedup);
    EXPECT_DOUBLE_EQ(skip.ttft, 0);
}

TEST(BenchMath, FlashProjectionFromASlice) {
    const BenchReport r = sample_report();
    const BenchRow& one = r.rows[0];
    ASSERT_EQ(one.layer_types.size(), 3u);
    EXPECT_EQ(one.layer_types[0], (LayerTypeTime{AttnType::Sliding, 2, 0.02}));
    EXPECT_EQ(one.layer_types[1], (LayerTypeTime{AttnType::CSA, 1, 0.05}));
    EXPECT_EQ(one.layer_types[2], (LayerTypeTime{AttnType::HCA, 1, 0.04}));
    ASSERT_TRUE(one.projection) << one.projection_note;
    const Projection& p = *one.projection;
    EXPECT_EQ(p.target, (ProjectionTarget{"V4-Flash", 2, 21, 20}));
    // remainder 0.2 − (0.01 + 0.03 + 0.05 + 0.04) = 0.07; 0.07 + 2·0.02 + 21·0.05 + 20·0.04.
    EXPECT_NEAR(p.remainder_seconds, 0.07, 1e-12);
    EXPECT_NEAR(p.ttft, 1.96, 1e-12);
    // The slice has the full model's dimensions: the projected FLOPs are the full model's.
    EXPECT_NEAR(p.flops / prefill_flops(preset_config("flash"), 8192), 1, 1e-12);
    EXPECT_NEAR(p.mfu, p.flops / (989e12 * 1.96), 1e-15);
    EXPECT_NEAR(p.tokens_per_s_per_gpu, 8192 / 1.96, 1e-9);
    // Rows without per-layer times get a reason instead.
    EXPECT_FALSE(r.rows[1].projection);
    EXPECT_EQ(r.rows[1].projection_note, "no per-layer times");
}

// Projecting the full model onto itself gives back the measured TTFT.
TEST(BenchMath, ProjectionOfTheFullModelIsItsTtft) {
    BenchReport r;
    r.preset = "flash";
    r.config = preset_config("flash");
    r.rows.push_back(raw_row(1, "off", 16384, {2.5}));
    for (int i = 0; i < r.config.n_layers; ++i)
        r.rows.back().layer_seconds.push_back(0.01 + 0.001 * (i % 7));
    finalize_report(r);
    ASSERT_TRUE(r.rows[0].projection) << r.rows[0].projection_note;
    EXPECT_NEAR(r.rows[0].projection->ttft, 2.5, 1e-12);
    EXPECT_NEAR(r.rows[0].projection->mfu, r.rows[0].mfu, 1e-12);
}

TEST(BenchMath, ProjectionNeedsEveryLayerTypeOfTheTarget) {
    BenchReport r;
    r.preset = "flash";
    r.config = with_layer_count(preset_config("flash"), 4);
    r.config.layer_types = {AttnType::CSA, AttnType::HCA, AttnType::CSA, AttnType::HCA};
    r.rows.push_back(raw_row(1, "off", 4096, {0.1}));
    r.rows.back().layer_seconds = {0.01, 0.01, 0.01, 0.01};
    finalize_report(r);
    EXPECT_FALSE(r.rows[0].projection);
    EXPECT_EQ(r.rows[0].projection_note, "no sliding layer measured");
    r.preset = "pro-slice";  // V4-Pro has no sliding layer: the projection exists
    finalize_report(r);
    ASSERT_TRUE(r.rows[0].projection);
    EXPECT_NEAR(r.rows[0].projection->ttft, 0.06 + 61 * 0.01, 1e-12);
    r.preset = "tiny";
    r.rows[0].projection.reset();
    finalize_report(r);
    EXPECT_FALSE(r.rows[0].projection);
}

// The hand config at 5 tokens with ceilings of 1 FLOP/s (bf16), 2 FLOP/s (fp8) and 1 B/s, so each
// floor is its FLOPs (or bytes) in seconds, from the sums above: attention Σ projections 3·640 +
// cores 384 + 512 + 448; compressor HCA 320 + CSA 640 + the indexer's compressor 5·2·2·4·(2·2) =
// 320; indexer CSA fixed 400 − 320 + scoring 24; MoE 3·640; other 3 layers · 5 tokens · 2 sites ·
// (read + write) · hc 1 · D 4 · 4 bytes = 960.
TEST(BenchFloors, HandConfigAtUnitCeilings) {
    const ModelConfig c = hand_config();
    const BenchCeilings unit{1e-12, 2e-12, 1e-9, 0, 0};
    const std::optional<GpuPhases> b = phase_floors(c, 5, 1, false, false, unit);
    ASSERT_TRUE(b);
    EXPECT_DOUBLE_EQ(b->attention, 1920 + 1344);
    EXPECT_DOUBLE_EQ(b->compressor, 1280);
    EXPECT_DOUBLE_EQ(b->indexer, 104);
    EXPECT_DOUBLE_EQ(b->moe, 1920);
    EXPECT_DOUBLE_EQ(b->other, 960);
    EXPECT_DOUBLE_EQ(b->collectives, 0);
    // fp8: the linears at twice the rate; compressor, attention core, scores and bytes as bf16.
    const std::optional<GpuPhases> f = phase_floors(c, 5, 1, true, false, unit);
    ASSERT_TRUE(f);
    EXPECT_DOUBLE_EQ(f->attention, 960 + 1344);
    EXPECT_DOUBLE_EQ(f->compressor, 1280);
    EXPECT_DOUBLE_EQ(f->indexer, 40 + 24);
    EXPECT_DOUBLE_EQ(f->moe, 960);
    EXPECT_DOUBLE_EQ(f->other, 960);
    // The fp8 indexer: its scores at the fp8 rate too (24 FLOPs at 2 FLOP/s).
    const std::optional<GpuPhases> f8 = phase_floors(c, 5, 1, true, true, unit);
    ASSERT_TRUE(f8);
    EXPECT_DOUBLE_EQ(f8->indexer, 40 + 12);
    EXPECT_DOUBLE_EQ(f8->attention, f->attention);
    // Two ranks share the work.
    const std::optional<GpuPhases> two = phase_floors(c, 5, 2, false, false, unit);
    ASSERT_TRUE(two);
    EXPECT_DOUBLE_EQ(two->attention, (1920 + 1344) / 2.0);
    EXPECT_DOUBLE_EQ(two->other, 480);
    // A bf16 residual (--residual bf16): 2 bytes a value, the other phases as before.
    const std::optional<GpuPhases> half = phase_floors(c, 5, 1, false, false, unit, 2);
    ASSERT_TRUE(half);
    EXPECT_DOUBLE_EQ(half->other, 480);
    EXPECT_DOUBLE_EQ(half->attention, b->attention);
    EXPECT_DOUBLE_EQ(half->moe, b->moe);
}

TEST(BenchFloors, NeedTheCeilingsTheyUse) {
    const ModelConfig c = hand_config();
    EXPECT_FALSE(phase_floors(c, 5, 1, false, false, std::nullopt));
    EXPECT_FALSE(phase_floors(c, 5, 1, true, false, BenchCeilings{800, 0, 4000, 0, 0}));  // no fp8
    EXPECT_TRUE(phase_floors(c, 5, 1, false, false, BenchCeilings{800, 0, 4000, 0, 0}));
    EXPECT_FALSE(
        phase_floors(c, 5, 1, false, true, BenchCeilings{800, 0, 4000, 0, 0}));  // fp8 scores
    EXPECT_FALSE(phase_floors(c, 5, 1, false, false, BenchCeilings{800, 1500, 0, 0, 0}));  // no HBM
}

// The report's floor table: measured / floor and their ratio, per phase, from the same run.
TEST(BenchReportMarkdown, PhasesAgainstTheirFloors) {
    const BenchReport r = sample_report();
    ASSERT_TRUE(r.rows[0].floors);
    const GpuPhases& f = *r.rows[0].floors;
    EXPECT_GT(f.moe, 0);
    const std::string md = report_markdown(r);
    ASSERT_NE(md.find("### Phases against their floors"), std::string::npos) << md;
    // Row 0: MoE 100 ms measured.
    const std::string cell = fmt::format("100.0 / {:.1f} ({:.2f}×)", f.moe * 1e3, 0.1 / f.moe);
    EXPECT_NE(md.find(cell), std::string::npos) << cell << "\n" << md;
    EXPECT_FALSE(r.rows[3].floors);  // skipped row
}

TEST(BenchReportJson, RoundTrip) {
    BenchReport r = sample_report();
    r.rows[0].indexer = "fp8";
    r.kernels = "attention_wg (attention)";
    const nlohmann::json j = report_to_json(r);
    const BenchReport back = report_from_json(nlohmann::json::parse(j.dump()));
    EXPECT_EQ(back.preset, r.preset);
    EXPECT_EQ(back.device, r.device);
    EXPECT_EQ(back.gpus, r.gpus);
    EXPECT_EQ(back.repeat, r.repeat);
    EXPECT_EQ(back.warmup, r.warmup);
    EXPECT_EQ(back.seed, r.seed);
    EXPECT_EQ(back.indexer, r.indexer);
    EXPECT_EQ(back.kernels, r.kernels);
    EXPECT_EQ(back.ceilings, r.ceilings);
    EXPECT_EQ(model_config_to_json(back.config, "hf"), model_config_to_json(r.config, "hf"));
    ASSERT_EQ(back.rows.size(), r.rows.size());
    for (size_t i = 0; i < r.rows.size(); ++i) EXPECT_TRUE(back.rows[i] == r.rows[i]) << i;
    EXPECT_EQ(report_to_json(back), j);
    EXPECT_TRUE(j["rows"][0]["projection"]["is_projection"].get<bool>());
    EXPECT_TRUE(j["rows"][3]["cp_speedup"].is_null());
}

// A chunked prefill's row says so in the tables and keeps its chunk through JSON; a report
// written before GPU chunking (no "chunk") reads as one pass.
TEST(BenchReportJson, ChunkedRowSaysItsChunk) {
    BenchReport r = sample_report();
    r.rows[1].chunk = 4096;
    const std::string md = report_markdown(r);
    EXPECT_NE(md.find("| 2 | off | bf16 | 8k in 4k chunks |"), std::string::npos) << md;
    EXPECT_NE(md.find("| 1 | off | bf16 | 8k |"), std::string::npos) << md;
    nlohmann::json j = report_to_json(r);
    EXPECT_EQ(report_from_json(j).rows[1].chunk, 4096);
    j["rows"][1].erase("chunk");
    EXPECT_EQ(report_from_json(j).rows[1].chunk, 0);
}

// The kernels a run took (CPFILL_ATTENTION) are in the header, so two benches of
// one machine say what they compare; a report written before they were recorded reads as none,
// and says nothing of them.
TEST(BenchReportJson, KernelsSaidAndKept) {
    BenchReport r = sample_report();
    r.kernels = "attention_tc (attention)";
    EXPECT_NE(report_markdown(r).find("Kernels: attention_tc (attention).\n"), std::string::npos);
    nlohmann::json j = report_to_json(r);
    j.erase("kernels");
    const BenchReport old = report_from_json(j);
    EXPECT_EQ(old.kernels, "");
    EXPECT_EQ(report_markdown(old).find("Kernels:"), std::string::npos);
}

// --collectives: said in the header when not NCCL, kept through JSON; a report written before it
// reads as NCCL.
TEST(BenchReportJson, CollectivesSaidAndKept) {
    BenchReport r = sample_report();
    EXPECT_EQ(report_markdown(r).find("Collectives:"), std::string::npos);
    r.collectives = "ce";
    EXPECT_NE(report_markdown(r).find("Collectives: ce (the GPUs' copy engines).\n"),
              std::string::npos);
    nlohmann::json j = report_to_json(r);
    EXPECT_EQ(report_from_json(j).collectives, "ce");
    j.erase("collectives");
    EXPECT_EQ(report_from_json(j).collectives, "nccl");
    // The copy engines' all-gather beside NCCL's on the ceilings line; kept through JSON, and
    // absent (0, not said) in a report written before it.
    r.ceilings = BenchCeilings{790, 0, 4200, 260, 2, 370};
    EXPECT_NE(report_markdown(r).find("260 GB/s busbw on 2 GPUs (copy engines: 370 GB/s)."),
              std::string::npos)
        << report_markdown(r);
    nlohmann::json k = report_to_json(r);
    EXPECT_EQ(report_from_json(k).ceilings, r.ceilings);
    k["ceilings"].erase("ce_allgather_busbw_gbps");
    const BenchReport old = report_from_json(k);
    EXPECT_EQ(old.ceilings->ce_allgather_busbw_gbps, 0);
    EXPECT_NE(report_markdown(old).find("260 GB/s busbw on 2 GPUs.\n"), std::string::npos);
}

// --residual: each row keeps it through JSON (a report written before it reads as fp32), the
// header says it, and a bf16 row's "other" floor counts 2 bytes a value.
TEST(BenchReportJson, ResidualSaidAndKept) {
    BenchReport r = sample_report();
    for (BenchRow& row : r.rows) row.residual = "bf16";
    EXPECT_NE(report_markdown(r).find("mHC residual bf16"), std::string::npos);
    nlohmann::json j = report_to_json(r);
    EXPECT_EQ(report_from_json(j).rows[1].residual, "bf16");
    j["rows"][1].erase("residual");
    EXPECT_EQ(report_from_json(j).rows[1].residual, "fp32");
}

TEST(BenchReportJson, RejectsWhatIsNotAReport) {
    EXPECT_THROW(report_from_json(nlohmann::json::array()), Error);
    nlohmann::json j = report_to_json(sample_report());
    j["rows"][0].erase("ttft_runs_s");
    try {
        report_from_json(j);
        FAIL() << "a row without ttft_runs_s was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("ttft_runs_s"), std::string::npos) << e.what();
    }
}

// A row's phase floors, when present, must be whole: a missing phase or a wrong type is named.
TEST(BenchReportJson, RejectsBrokenPhaseFloors) {
    nlohmann::json j = report_to_json(sample_report());
    ASSERT_TRUE(j["rows"][0]["phase_floors_s"].is_object());
    j["rows"][0]["phase_floors_s"].erase("moe");
    try {
        report_from_json(j);
        FAIL() << "phase floors without moe were accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("\"moe\""), std::string::npos) << e.what();
    }
    j["rows"][0]["phase_floors_s"] = "fast";
    EXPECT_THROW(report_from_json(j), Error);
    j["rows"][0]["phase_floors_s"] = nullptr;  // no floors: accepted
    EXPECT_FALSE(report_from_json(j).rows[0].floors);
}

TEST(BenchReportMarkdown, RowsReasonsAndProjectionLabel) {
    const std::string md = report_markdown(sample_report());
    EXPECT_NE(md.find("skipped: needs 4 GPUs, 2 visible"), std::string::npos) << md;
    EXPECT_NE(md.find("| 2 | off | bf16 | 8k |"), std::string::npos) << md;
    EXPECT_NE(md.find("1.74×"), std::string::npos) << md;   // 0.2 / 0.115
    EXPECT_NE(md.find("+15.0%"), std::string::npos) << md;  // exposed
    EXPECT_NE(md.find("not a measurement"), std::string::npos) << md;
    EXPECT_NE(md.find("790 TFLOP/s"), std::string::npos) << md;  // ceilings above the table
    EXPECT_LT(md.find("790 TFLOP/s"), md.find("| cp |"));
    EXPECT_NE(md.find("indexer bf16 in every row"), std::string::npos) << md;  // --indexer bf16
}

// Checks that tags nest and close, and that no '<' or '>' appears outside a tag.
::testing::AssertionResult well_formed(const std::string& svg) {
    std::vector<std::string> open;
    size_t pos = 0;
    while (pos < svg.size()) {
        const size_t lt = svg.find('<', pos);
        const std::string text = svg.substr(pos, lt == std::string::npos ? lt : lt - pos);
        if (text.find('>') != std::string::npos)
            return ::testing::AssertionFailure() << "'>' in text: " << text;
        if (lt == std::string::npos) break;
        const size_t gt = svg.find('>', lt);
        if (gt == std::string::npos) return ::testing::AssertionFailure() << "unclosed tag";
        const std::string tag = svg.substr(lt + 1, gt - lt - 1);
        if (tag.find('<') != std::string::npos)
            return ::testing::AssertionFailure() << "'<' inside tag: " << tag;
        if (tag[0] == '/') {
            const std::string closing = tag.substr(1);
            if (open.empty() || open.back() != closing)
                return ::testing::AssertionFailure() << "unexpected </" << closing << ">";
            open.pop_back();
        } else if (tag.back() != '/') {
            open.push_back(tag.substr(0, tag.find(' ')));
        }
        pos = gt + 1;
    }
    if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> not closed";
    return ::testing::AssertionSuccess();
}

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
}

TEST(BenchReportSvg, WellFormedOnePolylinePerSeriesEscaped) {
    BenchReport r = sample_report();
    r.rows.push_back(raw_row(1, "off", 32768, {0.9}));
    r.rows.push_back(raw_row(2, "off", 32768, {0.5}));
    finalize_report(r);
    const std::string svg = report_svg(r);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
    EXPECT_TRUE(well_formed(svg)) << svg;
    // Series (1, off) and (2, off) with 2 points, (2, on) with 1, (4, off) skipped: 3 polylines.
    EXPECT_EQ(count(svg, "<polyline"), 3u) << svg;
    EXPECT_EQ(count(svg, "<circle"), 5u) << svg;
    EXPECT_NE(svg.find("cp=4, TBO off (skipped)"), std::string::npos) << svg;
    EXPECT_NE(svg.find("&lt;test &amp; &quot;co&quot;&gt;"), std::string::npos) << svg;
    EXPECT_EQ(svg.find("<test"), std::string::npos) << svg;
    EXPECT_NE(svg.find(">8k</text>"), std::string::npos) << svg;  // x ticks at the lengths
    EXPECT_NE(svg.find(">32k</text>"), std::string::npos) << svg;
    EXPECT_NE(svg.find("tokens/s per GPU"), std::string::npos) << svg;
}

TEST(BenchReportSvg, NothingMeasuredStillWellFormed) {
    BenchReport r;
    r.preset = "tiny";
    r.config = preset_config("tiny");
    r.rows.push_back(raw_row(2, "off", 1024, {}));
    r.rows.back().skipped = "needs 2 GPUs, 0 visible";
    finalize_report(r);
    const std::string svg = report_svg(r);
    EXPECT_TRUE(well_formed(svg)) << svg;
    EXPECT_EQ(count(svg, "<polyline"), 0u);
}

}  // namespace
}  // namespace cpfill
