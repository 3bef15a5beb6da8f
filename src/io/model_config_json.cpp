// ModelConfig → config.json: the HF form (what transformers 5.17's save_pretrained writes for
// DeepseekV4Config, modern keys only) or the official reference form. Refuses what a form cannot
// express. The reader is model_config.cpp.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"

namespace cpfill {

namespace {

using ojson = nlohmann::ordered_json;

ojson rope_to_json(const RopeParams& p, double prf) {
    ojson j = ojson::object();
    j["rope_type"] = p.yarn ? "yarn" : "default";
    j["rope_theta"] = p.theta;
    j["partial_rotary_factor"] = prf;
    if (p.yarn) {
        j["factor"] = p.factor;
        j["original_max_position_embeddings"] = static_cast<int64_t>(p.original_max_pos);
        j["beta_fast"] = p.beta_fast;
        j["beta_slow"] = p.beta_slow;
        j["attention_factor"] = p.attention_factor;
    }
    return j;
}

ojson token_id(int64_t id) { return id < 0 ? ojson(nullptr) : ojson(id); }

// What HF's save_pretrained writes for DeepseekV4Config (every field the forward pass reads, in
// the modern form: no legacy keys).
ojson hf_json(const ModelConfig& c) {
    const double prf = static_cast<double>(c.rope_dim) / c.head_dim;
    CPFILL_CHECK(static_cast<int>(c.head_dim * prf) == c.rope_dim,
                 "rope_dim {} is not representable as head_dim {} * partial_rotary_factor",
                 c.rope_dim, c.head_dim);
    CPFILL_CHECK(c.swiglu_limit > 0,
                 "swiglu_limit 0 (no clamp) cannot be written in the HF form: HF always clamps");
    ojson j = ojson::object();
    j["architectures"] = {"DeepseekV4ForCausalLM"};
    j["model_type"] = "deepseek_v4";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["moe_intermediate_size"] = c.moe_dim;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = 1;
    j["head_dim"] = c.head_dim;
    j["q_lora_rank"] = c.q_rank;
    j["num_experts_per_tok"] = c.top_k;
    j["n_routed_experts"] = c.n_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["scoring_func"] = "sqrtsoftplus";
    j["norm_topk_prob"] = true;
    j["routed_scaling_factor"] = c.routed_scale;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rope_theta"] = c.rope_main.theta;
    ojson types = ojson::array(), mlp = ojson::array();
    for (AttnType t : c.layer_types) types.push_back(std::string(attn_type_name(t)));
    for (MlpType t : c.mlp_types) mlp.push_back(std::string(mlp_type_name(t)));
    j["layer_types"] = types;
    j["compress_rates"] = {{std::string(attn_type_name(AttnType::CSA)), c.csa_ratio},
                           {std::string(attn_type_name(AttnType::HCA)), c.hca_ratio}};
    j["compress_rope_theta"] = c.rope_compress.theta;
    j["hc_mult"] = c.hc;
    j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
    j["hc_eps"] = c.hc_eps;
    j["mlp_layer_types"] = mlp;
    j["swiglu_limit"] = c.swiglu_limit;
    j["sliding_window"] = c.window;
    j["o_groups"] = c.o_groups;
    j["o_lora_rank"] = c.o_rank;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["num_nextn_predict_layers"] = 0;
    j["hidden_act"] = "silu";
    j["initializer_range"] = 0.02;
    j["rms_norm_eps"] = c.norm_eps;
    j["use_cache"] = true;
    j["pad_token_id"] = nullptr;
    j["bos_token_id"] = token_id(c.bos_token_id);
    j["eos_token_id"] = token_id(c.eos_token_id);
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["rope_parameters"] = {{"main", rope_to_json(c.rope_main, prf)},
                            {"compress", rope_to_json(c.rope_compress, prf)}};
    j["partial_rotary_factor"] = prf;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["attention_dropout"] = 0.0;
    return j;
}

// The reference inference/config.json (ModelArgs keys). It cannot say everything the HF form can:
// main RoPE is always plain, compress RoPE is yarn without mscale, hash layers are a prefix.
ojson upstream_json(const ModelConfig& c) {
    const RopeParams& rc = c.rope_compress;
    CPFILL_CHECK(!c.rope_main.yarn, "the upstream config form cannot express a YaRN main rope");
    CPFILL_CHECK(!rc.yarn || rc.attention_factor == 1.0,
                 "the upstream config form cannot express a YaRN attention_factor {} != 1",
                 rc.attention_factor);
    int n_hash = 0;
    while (n_hash < c.n_layers && c.mlp_types[n_hash] == MlpType::Hash) ++n_hash;
    for (int i = n_hash; i < c.n_layers; ++i)
        CPFILL_CHECK(c.mlp_types[i] == MlpType::Learned,
                     "the upstream config form needs the hash layers first (layer {} is hash)", i);
    CPFILL_CHECK(!c.tie_word_embeddings, "the upstream config form has no tied embeddings");
    ojson j = ojson::object();  // only keys of ModelArgs: the reference code rejects others
    j["vocab_size"] = c.vocab_size;
    j["dim"] = c.d_model;
    j["moe_inter_dim"] = c.moe_dim;
    j["n_layers"] = c.n_layers;
    j["n_hash_layers"] = n_hash;
    j["n_heads"] = c.n_heads;
    j["n_routed_experts"] = c.n_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["n_activated_experts"] = c.top_k;
    j["score_func"] = "sqrtsoftplus";
    j["route_scale"] = c.routed_scale;
    j["swiglu_limit"] = c.swiglu_limit;
    j["q_lora_rank"] = c.q_rank;
    j["head_dim"] = c.head_dim;
    j["rope_head_dim"] = c.rope_dim;
    j["norm_eps"] = c.norm_eps;
    j["o_groups"] = c.o_groups;
    j["o_lora_rank"] = c.o_rank;
    j["window_size"] = c.window;
    j["original_seq_len"] = rc.yarn ? static_cast<int64_t>(rc.original_max_pos) : 0;
    j["rope_theta"] = c.rope_main.theta;
    j["rope_factor"] = rc.yarn ? rc.factor : 1.0;
    j["beta_fast"] = rc.beta_fast;
    j["beta_slow"] = rc.beta_slow;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["hc_mult"] = c.hc;
    j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
    j["hc_eps"] = c.hc_eps;
    j["compress_rope_theta"] = rc.theta;
    // Not ModelArgs keys (the reference code reads the ratios directly), but needed to map
    // non-default ratios back to layer types.
    if (c.csa_ratio != 4) j["compress_rate_csa"] = c.csa_ratio;
    if (c.hca_ratio != 128) j["compress_rate_hca"] = c.hca_ratio;
    ojson ratios = ojson::array();
    for (int i = 0; i < c.n_layers; ++i) ratios.push_back(c.ratio(i));
    ratios.push_back(0);  // the MTP block's entry, as in the release
    j["compress_ratios"] = ratios;
    return j;
}

}  // namespace

std::string model_config_to_json(const ModelConfig& cfg, const std::string& names) {
    validate_model_config(cfg, "model_config_to_json");
    if (names == "hf") return hf_json(cfg).dump(2) + "\n";
    if (names == "upstream") return upstream_json(cfg).dump(2) + "\n";
    CPFILL_FAIL("config form \"{}\": expected \"hf\" or \"upstream\"", names);
}

}  // namespace cpfill
