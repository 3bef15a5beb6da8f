// config.json parsing: the released V4-Flash config (hub form with legacy keys, and the reference
// inference/config.json), the HF form, HF's legacy folding rules, one test per validation error
// (the message must name the field) and round trips through model_config_to_json.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io/presets.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using json = nlohmann::json;
using test::expect_error;

// The hub config.json of DeepSeek-V4-Flash (docs/architecture.md §1): HF names plus the legacy
// keys compress_ratios (43 layers + 1 MTP entry), num_hash_layers, qk_rope_head_dim, rope_scaling.
const char* kFlashHub = R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 0],
  "compress_rope_theta": 160000,
  "expert_dtype": "fp4",
  "hc_eps": 1e-06,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "head_dim": 512,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "index_head_dim": 128,
  "index_n_heads": 64,
  "index_topk": 512,
  "initializer_range": 0.02,
  "max_position_embeddings": 1048576,
  "model_type": "deepseek_v4",
  "moe_intermediate_size": 2048,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 6,
  "num_hash_layers": 3,
  "num_hidden_layers": 43,
  "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                   "original_max_position_embeddings": 65536, "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus",
  "sliding_window": 128,
  "swiglu_limit": 10.0,
  "tie_word_embeddings": false,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "vocab_size": 129280
})";

// The reference inference/config.json of V4-Flash (ModelArgs keys).
const char* kFlashReference = R"({
  "vocab_size": 129280, "dim": 4096, "moe_inter_dim": 2048, "n_layers": 43, "n_hash_layers": 3,
  "n_heads": 64, "n_routed_experts": 256, "n_routed_experts_score": 128, "n_shared_experts": 1,
  "n_activated_experts": 6, "score_func": "sqrtsoftplus", "route_scale": 1.5,
  "swiglu_limit": 10.0, "q_lora_rank": 1024, "head_dim": 512, "rope_head_dim": 64,
  "o_groups": 8, "o_lora_rank": 1024, "window_size": 128, "original_seq_len": 65536,
  "rope_theta": 10000, "rope_factor": 16, "beta_fast": 32, "beta_slow": 1, "index_n_heads": 64,
  "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "dtype": "fp8", "scale_fmt": "ue8m0", "expert_dtype": "fp4", "compress_rope_theta": 160000,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 0]
})";

void expect_rope_eq(const RopeParams& a, const RopeParams& b, const char* what) {
    EXPECT_EQ(a.theta, b.theta) << what;
    EXPECT_EQ(a.yarn, b.yarn) << what;
    if (!a.yarn || !b.yarn) return;
    EXPECT_EQ(a.factor, b.factor) << what;
    EXPECT_EQ(a.original_max_pos, b.original_max_pos) << what;
    EXPECT_EQ(a.beta_fast, b.beta_fast) << what;
    EXPECT_EQ(a.beta_slow, b.beta_slow) << what;
    EXPECT_EQ(a.attention_factor, b.attention_factor) << what;
    EXPECT_EQ(a.truncate, b.truncate) << what;
}

void expect_config_eq(const ModelConfig& a, const ModelConfig& b) {
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.d_model, b.d_model);
    EXPECT_EQ(a.n_layers, b.n_layers);
    EXPECT_EQ(a.n_heads, b.n_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.rope_dim, b.rope_dim);
    EXPECT_EQ(a.q_rank, b.q_rank);
    EXPECT_EQ(a.o_groups, b.o_groups);
    EXPECT_EQ(a.o_rank, b.o_rank);
    EXPECT_EQ(a.window, b.window);
    EXPECT_EQ(a.n_experts, b.n_experts);
    EXPECT_EQ(a.top_k, b.top_k);
    EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
    EXPECT_EQ(a.moe_dim, b.moe_dim);
    EXPECT_EQ(a.hc, b.hc);
    EXPECT_EQ(a.hc_sinkhorn_iters, b.hc_sinkhorn_iters);
    EXPECT_EQ(a.hc_eps, b.hc_eps);
    EXPECT_EQ(a.norm_eps, b.norm_eps);
    EXPECT_EQ(a.routed_scale, b.routed_scale);
    EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
    EXPECT_EQ(a.index_n_heads, b.index_n_heads);
    EXPECT_EQ(a.index_head_dim, b.index_head_dim);
    EXPECT_EQ(a.index_topk, b.index_topk);
    EXPECT_EQ(a.csa_ratio, b.csa_ratio);
    EXPECT_EQ(a.hca_ratio, b.hca_ratio);
    EXPECT_EQ(a.layer_types, b.layer_types);
    EXPECT_EQ(a.mlp_types, b.mlp_types);
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    EXPECT_EQ(a.eos_token_id, b.eos_token_id);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    expect_rope_eq(a.rope_main, b.rope_main, "rope_main");
    expect_rope_eq(a.rope_compress, b.rope_compress, "rope_compress");
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

// Expects parsing `j` to fail with a message naming `field` (and the file).
void expect_field_error(const json& j, const std::string& field) {
    expect_error([&] { parse(j); }, {"\"" + field, "test/config.json"});
}

json flash_hub() { return json::parse(kFlashHub); }

TEST(ModelConfig, FlashHubConfig) {
    ModelConfig c = parse_model_config(kFlashHub, "flash/config.json");
    EXPECT_EQ(c.n_layers, 43);
    EXPECT_EQ(c.rope_dim, 64);
    EXPECT_EQ(c.nope_dim(), 448);
    ASSERT_EQ(c.layer_types.size(), 43u);  // the MTP entry is dropped
    EXPECT_EQ(c.layer_types[0], AttnType::Sliding);
    EXPECT_EQ(c.layer_types[1], AttnType::Sliding);
    EXPECT_EQ(c.layer_types[2], AttnType::CSA);
    EXPECT_EQ(c.layer_types[3], AttnType::HCA);
    EXPECT_EQ(c.layer_types[42], AttnType::CSA);
    EXPECT_EQ(c.ratio(41), 128);
    EXPECT_EQ(c.mlp_types[2], MlpType::Hash);
    EXPECT_EQ(c.mlp_types[3], MlpType::Learned);
    // rope_scaling folds into the compress table only, with attention_factor forced to 1.
    EXPECT_FALSE(c.rope_main.yarn);
    EXPECT_EQ(c.rope_main.theta, 10000.0);
    EXPECT_TRUE(c.rope_compress.yarn);
    EXPECT_EQ(c.rope_compress.theta, 160000.0);
    EXPECT_EQ(c.rope_compress.factor, 16.0);
    EXPECT_EQ(c.rope_compress.original_max_pos, 65536.0);
    EXPECT_EQ(c.rope_compress.attention_factor, 1.0);
    expect_config_eq(c, preset_config("flash"));
}

TEST(ModelConfig, FlashReferenceConfig) {
    expect_config_eq(parse_model_config(kFlashReference, "inference/config.json"),
                     preset_config("flash"));
}

TEST(ModelConfig, HfFormWithNestedRope) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    EXPECT_EQ(j["model_type"], "deepseek_v4");
    EXPECT_EQ(j["architectures"][0], "DeepseekV4ForCausalLM");
    EXPECT_EQ(j["layer_types"][1], "compressed_sparse_attention");
    EXPECT_EQ(j["mlp_layer_types"][0], "hash_moe");
    EXPECT_EQ(j["compress_rates"]["heavily_compressed_attention"], 128);
    EXPECT_EQ(j["rope_parameters"]["compress"]["rope_type"], "yarn");
    EXPECT_EQ(j["rope_parameters"]["main"]["rope_type"], "default");
    EXPECT_FALSE(j.contains("compress_ratios"));
    EXPECT_FALSE(j.contains("rope_scaling"));
    // Nested yarn without attention_factor: HF's yarn default 0.1·ln(factor) + 1.
    j["rope_parameters"]["compress"].erase("attention_factor");
    ModelConfig c = parse(j);
    EXPECT_NEAR(c.rope_compress.attention_factor, 0.1 * std::log(16.0) + 1.0, 1e-12);
}

TEST(ModelConfig, NestedRopeWithoutThetaTakesTopLevelRopeTheta) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["rope_parameters"]["compress"].erase("rope_theta");
    EXPECT_EQ(parse(j).rope_compress.theta, 10000.0);
}

TEST(ModelConfig, FlatRopeParametersFoldLikeRopeScaling) {
    json j = flash_hub();
    j["rope_parameters"] = j["rope_scaling"];
    j.erase("rope_scaling");
    ModelConfig c = parse(j);
    EXPECT_TRUE(c.rope_compress.yarn);
    EXPECT_EQ(c.rope_compress.attention_factor, 1.0);
    EXPECT_EQ(c.rope_compress.theta, 160000.0);
}

TEST(ModelConfig, NoRopeScalingMeansPlainCompressRope) {
    json j = flash_hub();
    j.erase("rope_scaling");
    ModelConfig c = parse(j);
    EXPECT_FALSE(c.rope_compress.yarn);
    EXPECT_EQ(c.rope_compress.theta, 160000.0);
}

TEST(ModelConfig, YarnFactorDefaultsToPositionRatio) {
    json j = flash_hub();
    j["rope_scaling"].erase("factor");
    EXPECT_EQ(parse(j).rope_compress.factor, 1048576.0 / 65536.0);
}

TEST(ModelConfig, LegacyDefaultsAndAlternatives) {
    json j = flash_hub();
    j["compress_ratios"].erase(j["compress_ratios"].size() - 1);  // without the MTP entry
    j.erase("num_hash_layers");                                   // HF default: 3
    j.erase("qk_rope_head_dim");                                  // HF default: 64/512
    j["eos_token_id"] = {1, 7};
    ModelConfig c = parse(j);
    EXPECT_EQ(c.layer_types.size(), 43u);
    EXPECT_EQ(c.mlp_types[2], MlpType::Hash);
    EXPECT_EQ(c.mlp_types[3], MlpType::Learned);
    EXPECT_EQ(c.rope_dim, 64);
    EXPECT_EQ(c.eos_token_id, 1);
    j["partial_rotary_factor"] = 0.25;
    EXPECT_EQ(parse(j).rope_dim, 128);
    j["layer_types"] = json::array();
    for (int i = 0; i < 43; ++i) j["layer_types"].push_back("heavily_compressed_attention");
    EXPECT_EQ(parse(j).layer_types[0], AttnType::HCA);  // layer_types wins over compress_ratios
}

TEST(ModelConfig, LegacyCompressRateOverrides) {
    json j = flash_hub();
    j["compress_rate_hca"] = 64;
    for (auto& r : j["compress_ratios"])
        if (r == 128) r = 64;
    ModelConfig c = parse(j);
    EXPECT_EQ(c.hca_ratio, 64);
    EXPECT_EQ(c.layer_types[3], AttnType::HCA);
}

TEST(ModelConfig, RoundTripEveryPresetAndForm) {
    for (const std::string& name : preset_names())
        for (const char* form : {"hf", "upstream"}) {
            SCOPED_TRACE(name + " / " + form);
            ModelConfig c = preset_config(name);
            expect_config_eq(parse_model_config(model_config_to_json(c, form), "rt"), c);
        }
}

TEST(ModelConfig, RoundTripNonDefaults) {
    ModelConfig c = preset_config("tiny");
    c.rope_main.yarn = true;  // only the HF form can say this
    c.rope_main.factor = 4;
    c.rope_main.original_max_pos = 4096;
    c.rope_main.attention_factor = 1.25;
    c.mlp_types = {MlpType::Learned, MlpType::Hash, MlpType::Learned, MlpType::Hash};
    c.eos_token_id = -1;
    c.tie_word_embeddings = true;
    expect_config_eq(parse_model_config(model_config_to_json(c, "hf"), "rt"), c);
    expect_error([&] { model_config_to_json(c, "upstream"); }, {"upstream"});
    expect_error([&] { model_config_to_json(c, "gguf"); }, {"gguf"});
}

// ---- validation: one test per error, each naming the field -------------------------------------

TEST(ModelConfigErrors, NotJson) {
    expect_error([] { parse_model_config("{\"vocab_size\": ", "bad.json"); },
                 {"bad.json", "not valid JSON"});
    expect_error([] { parse_model_config("[1, 2]", "bad.json"); }, {"bad.json", "object"});
}

TEST(ModelConfigErrors, MissingRequiredField) {
    json j = flash_hub();
    j.erase("hidden_size");
    expect_error([&] { parse(j); }, {"\"hidden_size\"", "\"dim\"", "missing", "test/config.json"});
}

TEST(ModelConfigErrors, WrongJsonType) {
    json j = flash_hub();
    j["num_attention_heads"] = "64";
    expect_error([&] { parse(j); }, {"\"num_attention_heads\"", "an integer", "a string"});
}

TEST(ModelConfigErrors, FloatWhereIntegerExpected) {
    json j = flash_hub();
    j["head_dim"] = 512.5;
    expect_field_error(j, "head_dim");
}

TEST(ModelConfigErrors, NegativeCount) {
    json j = flash_hub();
    j["vocab_size"] = -1;
    expect_field_error(j, "vocab_size");
}

TEST(ModelConfigErrors, RopeDimAboveHeadDim) {
    json j = flash_hub();
    j["qk_rope_head_dim"] = 1024;
    expect_field_error(j, "qk_rope_head_dim");
}

TEST(ModelConfigErrors, RopeDimOdd) {
    json j = flash_hub();
    j["qk_rope_head_dim"] = 63;
    expect_field_error(j, "qk_rope_head_dim");
}

TEST(ModelConfigErrors, HeadsNotDivisibleByGroups) {
    json j = flash_hub();
    j["o_groups"] = 7;
    expect_error([&] { parse(j); }, {"\"o_groups\"", "num_attention_heads = 64", "found 7"});
}

TEST(ModelConfigErrors, CompressRatiosLength) {
    json j = flash_hub();
    j["compress_ratios"].erase(0);
    j["compress_ratios"].erase(0);
    expect_error([&] { parse(j); }, {"\"compress_ratios\"", "43 entries", "found 42 entries"});
}

TEST(ModelConfigErrors, CompressRatioValue) {
    json j = flash_hub();
    j["compress_ratios"][2] = 7;
    expect_field_error(j, "compress_ratios[2]");
}

TEST(ModelConfigErrors, LayerTypesLength) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["layer_types"].push_back("sliding_attention");
    expect_error([&] { parse(j); }, {"\"layer_types\"", "4 entries", "found 5"});
}

TEST(ModelConfigErrors, UnknownLayerType) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["layer_types"][1] = "full_attention";
    expect_error([&] { parse(j); }, {"\"layer_types[1]\"", "full_attention"});
}

TEST(ModelConfigErrors, MlpLayerTypesLength) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["mlp_layer_types"].erase(0);
    expect_field_error(j, "mlp_layer_types");
}

TEST(ModelConfigErrors, UnknownMlpType) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["mlp_layer_types"][0] = "dense";
    expect_field_error(j, "mlp_layer_types[0]");
}

TEST(ModelConfigErrors, MissingLayerTypes) {
    json j = flash_hub();
    j.erase("compress_ratios");
    expect_error([&] { parse(j); }, {"\"layer_types\"", "\"compress_ratios\"", "missing"});
}

TEST(ModelConfigErrors, ScoringFunc) {
    json j = flash_hub();
    j["scoring_func"] = "softmax";
    expect_error([&] { parse(j); }, {"\"scoring_func\"", "sqrtsoftplus", "softmax"});
}

TEST(ModelConfigErrors, SharedExperts) {
    json j = flash_hub();
    j["n_shared_experts"] = 2;
    expect_field_error(j, "n_shared_experts");
}

TEST(ModelConfigErrors, TopKAboveExperts) {
    json j = flash_hub();
    j["num_experts_per_tok"] = 300;
    expect_error([&] { parse(j); }, {"\"num_experts_per_tok\"", "256", "300"});
}

TEST(ModelConfigErrors, KeyValueHeads) {
    json j = flash_hub();
    j["num_key_value_heads"] = 8;
    expect_field_error(j, "num_key_value_heads");
}

TEST(ModelConfigErrors, HcMult) {
    json j = flash_hub();
    j["hc_mult"] = 0;
    expect_field_error(j, "hc_mult");
}

TEST(ModelConfigErrors, ModelType) {
    json j = flash_hub();
    j["model_type"] = "deepseek_v3";
    expect_field_error(j, "model_type");
}

TEST(ModelConfigErrors, UnsupportedRopeType) {
    json j = flash_hub();
    j["rope_scaling"]["type"] = "llama3";
    expect_field_error(j, "rope_scaling.type");
}

TEST(ModelConfigErrors, RopeFieldType) {
    json j = flash_hub();
    j["rope_scaling"]["factor"] = "16";
    expect_error([&] { parse(j); }, {"\"rope_scaling.factor\"", "a number", "a string"});
}

TEST(ModelConfigErrors, NestedPartialRotaryMismatch) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.25;
    expect_field_error(j, "rope_parameters.compress.partial_rotary_factor");
}

TEST(ModelConfigErrors, SharedExpertBias) {
    json j = flash_hub();
    j["mlp_bias"] = true;
    expect_field_error(j, "mlp_bias");
}

TEST(ModelConfigErrors, EqualCompressRates) {
    json j = json::parse(model_config_to_json(preset_config("tiny"), "hf"));
    j["compress_rates"]["heavily_compressed_attention"] = 4;
    expect_field_error(j, "compress_rates");
}

TEST(ModelConfigErrors, LoadMissingFile) {
    expect_error([] { load_model_config("/nonexistent/config.json"); },
                 {"/nonexistent/config.json"});
}

TEST(Presets, UnknownNameListsKnownOnes) {
    expect_error([] { preset_config("flash-lite"); }, {"flash-lite", "tiny", "pro-slice"});
}

TEST(Presets, Shapes) {
    ModelConfig pro = preset_config("pro");
    EXPECT_EQ(pro.n_layers, 61);
    EXPECT_EQ(pro.layer_types[0], AttnType::HCA);
    EXPECT_EQ(pro.layer_types[60], AttnType::CSA);
    EXPECT_EQ(pro.index_topk, 1024);
    ModelConfig slice = preset_config("flash-slice");
    EXPECT_EQ(slice.d_model, 4096);
    EXPECT_EQ(slice.layer_types, (std::vector<AttnType>{AttnType::Sliding, AttnType::Sliding,
                                                        AttnType::CSA, AttnType::HCA}));
    EXPECT_EQ(slice.mlp_types[2], MlpType::Hash);
    ModelConfig tiny = preset_config("tiny");
    EXPECT_EQ(tiny.head_dim, 512);
    EXPECT_EQ(tiny.index_topk, 16);
    EXPECT_EQ(tiny.window, 128);
}

}  // namespace
}  // namespace cpfill
