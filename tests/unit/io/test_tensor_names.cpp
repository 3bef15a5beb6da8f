// The weight table (shapes and storage classes of V4-Flash / V4-Pro, docs/architecture.md §6.2,
// §6.3) and the name table across upstream / hf-saved / hf-module namings (§6.1, §8).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "io/presets.h"
#include "io/tensor_names.h"
#include "io/weight_specs.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::expect_error;

void expect_spec(const WeightSpecTable& t, const std::string& name, const Shape& shape,
                 WeightClass cls) {
    const WeightSpec* s = t.find(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->shape, shape) << name;
    EXPECT_EQ(s->cls, cls) << name << " is " << weight_class_name(s->cls);
}

TEST(WeightSpecs, FlashShapesAndClasses) {
    const WeightSpecTable t(preset_config("flash"));
    using C = WeightClass;
    expect_spec(t, "embed.weight", {129280, 4096}, C::BF16);
    expect_spec(t, "head.weight", {129280, 4096}, C::BF16);
    expect_spec(t, "hc_head_fn", {4, 16384}, C::F32);
    expect_spec(t, "hc_head_base", {4}, C::F32);
    expect_spec(t, "hc_head_scale", {1}, C::F32);
    expect_spec(t, "layers.0.hc_attn_fn", {24, 16384}, C::F32);
    expect_spec(t, "layers.0.hc_ffn_base", {24}, C::F32);
    expect_spec(t, "layers.0.hc_ffn_scale", {3}, C::F32);
    expect_spec(t, "layers.0.attn.attn_sink", {64}, C::F32);
    expect_spec(t, "layers.0.attn.wq_a.weight", {1024, 4096}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wq_b.weight", {32768, 1024}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wkv.weight", {512, 4096}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.kv_norm.weight", {512}, C::BF16);
    expect_spec(t, "layers.0.attn.wo_a.weight", {8192, 4096}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wo_b.weight", {4096, 8192}, C::Fp8Linear);
    expect_spec(t, "layers.0.ffn.gate.weight", {256, 4096}, C::BF16);
    expect_spec(t, "layers.0.ffn.gate.tid2eid", {129280, 6}, C::I64);
    expect_spec(t, "layers.3.ffn.gate.bias", {256}, C::F32);
    expect_spec(t, "layers.0.ffn.shared_experts.w2.weight", {4096, 2048}, C::Fp8Linear);
    expect_spec(t, "layers.0.ffn.experts.255.w1.weight", {2048, 4096}, C::Fp4Expert);
    expect_spec(t, "layers.0.ffn.experts.0.w2.weight", {4096, 2048}, C::Fp4Expert);
    // HCA (layer 3) and CSA (layer 2) compressors; the indexer only on CSA.
    expect_spec(t, "layers.3.attn.compressor.wkv.weight", {512, 4096}, C::BF16);
    expect_spec(t, "layers.3.attn.compressor.ape", {128, 512}, C::F32);
    expect_spec(t, "layers.2.attn.compressor.wgate.weight", {1024, 4096}, C::BF16);
    expect_spec(t, "layers.2.attn.compressor.ape", {4, 1024}, C::F32);
    expect_spec(t, "layers.2.attn.compressor.norm.weight", {512}, C::BF16);
    expect_spec(t, "layers.2.attn.indexer.wq_b.weight", {8192, 1024}, C::Fp8Linear);
    expect_spec(t, "layers.2.attn.indexer.weights_proj.weight", {64, 4096}, C::BF16);
    expect_spec(t, "layers.2.attn.indexer.compressor.wkv.weight", {256, 4096}, C::BF16);
    expect_spec(t, "layers.2.attn.indexer.compressor.ape", {4, 256}, C::F32);
    expect_spec(t, "layers.2.attn.indexer.compressor.norm.weight", {128}, C::BF16);
    EXPECT_EQ(t.find("layers.0.attn.compressor.wkv.weight"), nullptr);  // sliding
    EXPECT_EQ(t.find("layers.3.attn.indexer.wq_b.weight"), nullptr);    // HCA
    EXPECT_EQ(t.find("layers.3.ffn.gate.tid2eid"), nullptr);            // learned
    EXPECT_EQ(t.find("layers.2.ffn.gate.bias"), nullptr);               // hash
    expect_error([&] { t.at("layers.0.attn.indexer.wq_b.weight"); },
                 {"layers.0.attn.indexer.wq_b.weight", "not a weight of this model"});
}

TEST(WeightSpecs, FlashCounts) {
    const ModelConfig cfg = preset_config("flash");
    int compressors = 0, indexers = 0, tid2eid = 0, bias = 0;
    for (const WeightSpec& s : weight_specs(cfg)) {
        compressors += s.name.ends_with(".attn.compressor.wkv.weight");
        indexers += s.name.ends_with(".indexer.wq_b.weight");
        tid2eid += s.name.ends_with("tid2eid");
        bias += s.name.ends_with("gate.bias");
    }
    EXPECT_EQ(compressors, 41);
    EXPECT_EQ(indexers, 21);
    EXPECT_EQ(tid2eid, 3);
    EXPECT_EQ(bias, 40);
    const auto layer = layer_weight_specs(cfg, 2);
    EXPECT_EQ(layer.front().layer, 2);
    EXPECT_EQ(layer.back().expert, 255);
}

// expert_weight_name spells the table's names (what the GPU upload asks the checkpoint for), and
// names only expert matrices.
TEST(WeightSpecs, ExpertWeightNamesAreTheTables) {
    const ModelConfig cfg = preset_config("tiny");
    int experts = 0;
    for (const WeightSpec& s : weight_specs(cfg)) {
        if (!is_expert_weight(s)) continue;
        EXPECT_EQ(expert_weight_name(s.layer, s.expert, s.slot), s.name);
        ++experts;
    }
    EXPECT_EQ(experts, cfg.n_layers * (cfg.n_experts + 1) * 3);  // routed + shared, w1 w2 w3
    EXPECT_EQ(expert_weight_name(3, -1, WeightSlot::W1), "layers.3.ffn.shared_experts.w1.weight");
    EXPECT_EQ(expert_weight_name(3, 7, WeightSlot::W2), "layers.3.ffn.experts.7.w2.weight");
    expect_error([] { expert_weight_name(0, 0, WeightSlot::Gate); }, {"not an expert matrix"});
}

TEST(WeightSpecs, ProShapes) {
    const WeightSpecTable t(preset_config("pro"));
    using C = WeightClass;
    expect_spec(t, "layers.0.attn.wq_a.weight", {1536, 7168}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wq_b.weight", {65536, 1536}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wo_a.weight", {16384, 4096}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.wo_b.weight", {7168, 16384}, C::Fp8Linear);
    expect_spec(t, "layers.0.attn.attn_sink", {128}, C::F32);
    expect_spec(t, "layers.0.hc_attn_fn", {24, 28672}, C::F32);
    expect_spec(t, "layers.0.attn.compressor.ape", {128, 512}, C::F32);  // Pro layer 0 is HCA
    expect_spec(t, "layers.2.attn.indexer.wq_b.weight", {8192, 1536}, C::Fp8Linear);
    expect_spec(t, "layers.60.ffn.gate.bias", {384}, C::F32);
    expect_spec(t, "layers.5.ffn.experts.383.w2.weight", {7168, 3072}, C::Fp4Expert);
    expect_spec(t, "hc_head_fn", {4, 28672}, C::F32);
}

TEST(TensorNames, KnownMappings) {
    struct Case {
        const char* canonical;
        const char* hf_saved;
        const char* hf_module;
    };
    const Case cases[] = {
        {"embed.weight", "model.embed_tokens.weight", "model.embed_tokens.weight"},
        {"head.weight", "head.weight", "lm_head.weight"},
        {"norm.weight", "model.norm.weight", "model.norm.weight"},
        {"hc_head_fn", "model.hc_head.hc_fn", "model.hc_head.hc_fn"},
        {"layers.7.hc_attn_base", "model.layers.7.hc_attn_base", "model.layers.7.attn_hc.base"},
        {"layers.7.attn_norm.weight", "model.layers.7.attn_norm.weight",
         "model.layers.7.input_layernorm.weight"},
        {"layers.7.ffn_norm.weight", "model.layers.7.ffn_norm.weight",
         "model.layers.7.post_attention_layernorm.weight"},
        {"layers.7.attn.kv_norm.weight", "model.layers.7.attn.norm.weight",
         "model.layers.7.self_attn.kv_norm.weight"},
        {"layers.7.attn.q_norm.weight", "model.layers.7.attn.q_norm.weight",
         "model.layers.7.self_attn.q_a_norm.weight"},
        {"layers.7.attn.attn_sink", "model.layers.7.attn.attn_sink",
         "model.layers.7.self_attn.sinks"},
        {"layers.7.attn.wo_a.weight", "model.layers.7.attn.wo_a.weight",
         "model.layers.7.self_attn.o_a_proj.weight"},
        {"layers.2.attn.compressor.ape", "model.layers.2.attn.compressor.ape",
         "model.layers.2.self_attn.compressor.position_bias"},
        {"layers.2.attn.compressor.norm.weight", "model.layers.2.attn.compressor.norm.weight",
         "model.layers.2.self_attn.compressor.kv_norm.weight"},
        {"layers.2.attn.indexer.wq_b.weight", "model.layers.2.attn.indexer.wq_b.weight",
         "model.layers.2.self_attn.compressor.indexer.q_b_proj.weight"},
        {"layers.2.attn.indexer.weights_proj.weight",
         "model.layers.2.attn.indexer.weights_proj.weight",
         "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight"},
        {"layers.2.attn.indexer.compressor.wgate.weight",
         "model.layers.2.attn.indexer.compressor.wgate.weight",
         "model.layers.2.self_attn.compressor.indexer.gate_proj.weight"},
        {"layers.4.ffn.gate.bias", "model.layers.4.ffn.gate.bias",
         "model.layers.4.mlp.gate.e_score_correction_bias"},
        {"layers.0.ffn.gate.tid2eid", "model.layers.0.ffn.gate.tid2eid",
         "model.layers.0.mlp.gate.tid2eid"},
        {"layers.4.ffn.shared_experts.w3.weight", "model.layers.4.ffn.shared_experts.w3.weight",
         "model.layers.4.mlp.shared_experts.up_proj.weight"},
    };
    for (const Case& c : cases) {
        EXPECT_EQ(stored_name(c.canonical, Naming::Upstream).name, c.canonical);
        EXPECT_EQ(stored_name(c.canonical, Naming::HfSaved).name, c.hf_saved);
        EXPECT_EQ(stored_name(c.canonical, Naming::HfModule).name, c.hf_module);
        EXPECT_EQ(canonical_name(c.hf_saved, Naming::HfSaved), c.canonical);
        EXPECT_EQ(canonical_name(c.hf_module, Naming::HfModule), c.canonical);
    }
    // The older HF modeling without the scorer submodule.
    StoredName wp = stored_name("layers.2.attn.indexer.weights_proj.weight", Naming::HfModule);
    ASSERT_EQ(wp.alternates.size(), 1u);
    EXPECT_EQ(wp.alternates[0], "model.layers.2.self_attn.compressor.indexer.weights_proj.weight");
    EXPECT_EQ(canonical_name(wp.alternates[0], Naming::HfModule),
              "layers.2.attn.indexer.weights_proj.weight");
}

TEST(TensorNames, StackedExperts) {
    StoredName w1 = stored_name("layers.3.ffn.experts.17.w1.weight", Naming::HfModule);
    EXPECT_EQ(w1.name, "model.layers.3.mlp.experts.gate_up_proj");
    EXPECT_EQ(w1.expert, 17);
    EXPECT_EQ(w1.part, StackPart::FirstHalf);
    StoredName w3 = stored_name("layers.3.ffn.experts.17.w3.weight", Naming::HfModule);
    EXPECT_EQ(w3.name, w1.name);
    EXPECT_EQ(w3.part, StackPart::SecondHalf);
    StoredName w2 = stored_name("layers.3.ffn.experts.17.w2.weight", Naming::HfModule);
    EXPECT_EQ(w2.name, "model.layers.3.mlp.experts.down_proj");
    EXPECT_EQ(w2.expert, 17);
    EXPECT_EQ(w2.part, StackPart::Whole);
    EXPECT_EQ(stored_name("layers.3.ffn.experts.17.w2.weight", Naming::HfSaved).name,
              "model.layers.3.ffn.experts.17.w2.weight");
    EXPECT_EQ(canonical_name("model.layers.3.mlp.experts.gate_up_proj", Naming::HfModule),
              std::nullopt);
}

TEST(TensorNames, EveryFlashWeightRoundTripsAndIsUnique) {
    for (Naming n : {Naming::Upstream, Naming::HfSaved, Naming::HfModule}) {
        std::map<std::string, std::string> seen;
        for (const WeightSpec& s : weight_specs(preset_config("flash-slice"))) {
            StoredName sn = stored_name(s.name, n);
            if (sn.expert >= 0) continue;
            EXPECT_EQ(canonical_name(sn.name, n), s.name) << naming_name(n);
            auto [it, fresh] = seen.emplace(sn.name, s.name);
            EXPECT_TRUE(fresh) << sn.name << " used by " << it->second << " and " << s.name;
        }
    }
}

TEST(TensorNames, ScaleNames) {
    EXPECT_EQ(scale_name("layers.0.attn.wq_a.weight", Naming::Upstream),
              "layers.0.attn.wq_a.scale");
    EXPECT_EQ(scale_name("model.layers.0.attn.wq_a.weight", Naming::HfSaved),
              "model.layers.0.attn.wq_a.scale");
    EXPECT_EQ(scale_name("model.layers.0.self_attn.q_a_proj.weight", Naming::HfModule),
              "model.layers.0.self_attn.q_a_proj.weight_scale_inv");
    EXPECT_EQ(scale_name("model.layers.0.mlp.experts.gate_up_proj", Naming::HfModule),
              "model.layers.0.mlp.experts.gate_up_proj_scale_inv");
    // Either spelling is accepted under every naming.
    const auto c = scale_names("layers.0.attn.wq_a.weight", Naming::Upstream);
    EXPECT_NE(std::find(c.begin(), c.end(), "layers.0.attn.wq_a.weight_scale_inv"), c.end());
}

TEST(TensorNames, DetectNaming) {
    EXPECT_EQ(detect_naming({"embed.weight", "mtp.0.foo"}), Naming::Upstream);
    EXPECT_EQ(detect_naming({"head.weight", "model.layers.0.attn.wq_a.weight"}), Naming::HfSaved);
    EXPECT_EQ(detect_naming({"lm_head.weight", "model.embed_tokens.weight"}), Naming::HfModule);
    EXPECT_EQ(detect_naming({"model.layers.0.self_attn.q_a_proj.weight"}), Naming::HfModule);
    EXPECT_EQ(detect_naming({"foo", "bar"}), std::nullopt);
    EXPECT_EQ(parse_naming("hf-saved"), Naming::HfSaved);
    EXPECT_EQ(parse_naming("gguf"), std::nullopt);
}

TEST(TensorNames, UnknownCanonicalName) {
    expect_error([] { stored_name("layers.0.attn.wq_c.weight", Naming::HfSaved); },
                 {"layers.0.attn.wq_c.weight"});
    EXPECT_EQ(canonical_name("model.layers.x.attn.wq_a.weight", Naming::HfSaved), std::nullopt);
    EXPECT_EQ(canonical_name("model.layers.99999999999.attn.wq_a.weight", Naming::HfSaved),
              std::nullopt);
}

}  // namespace
}  // namespace cpfill
