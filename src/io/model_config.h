// ModelConfig: every hyperparameter of a DeepSeek-V4 model that the forward pass reads, parsed from
// a checkpoint's config.json in either the HF form (layer_types, compress_rates, mlp_layer_types,
// rope_parameters {main, compress}) or the official form (compress_ratios, num_hash_layers,
// rope_scaling, dim, n_layers, ...). See docs/architecture.md §1–§2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cpfill {

// HF: sliding_attention, compressed_sparse_attention, heavily_compressed_attention.
enum class AttnType { Sliding, CSA, HCA };
enum class MlpType { Hash, Learned };  // HF: hash_moe, moe

std::string_view attn_type_name(AttnType t);  // the HF spelling
std::string_view mlp_type_name(MlpType t);

// RoPE parameters of one table (main or compress). YaRN when `yarn` is true. The values are the
// ones HF 5.17 computes with: `factor` defaults to max_position_embeddings / original when absent,
// `attention_factor` is 1.0 when folded from legacy rope_scaling (V4 forces it) and otherwise
// defaults to 0.1·ln(factor) + 1 like HF's yarn; `truncate` is always true because HF reads it
// from the top level of rope_parameters, which for V4 only holds {main, compress}.
struct RopeParams {
    double theta = 10000.0;
    bool yarn = false;
    double factor = 1.0;              // YaRN scaling factor
    double original_max_pos = 65536;  // YaRN original_max_position_embeddings
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double attention_factor = 1.0;  // multiplies cos/sin; V4 forces 1.0
    bool truncate = true;           // HF yarn: floor/ceil the correction range
};

struct ModelConfig {
    int64_t vocab_size = 0;
    int64_t d_model = 0;  // hidden_size / dim
    int n_layers = 0;     // num_hidden_layers / n_layers (MTP excluded)
    int n_heads = 0;      // num_attention_heads
    int head_dim = 0;     // 512 in the real models
    int rope_dim = 0;     // qk_rope_head_dim = head_dim * partial_rotary_factor
    int q_rank = 0;       // q_lora_rank
    int o_groups = 0;
    int o_rank = 0;            // o_lora_rank
    int window = 0;            // sliding_window
    int n_experts = 0;         // n_routed_experts
    int top_k = 0;             // num_experts_per_tok
    int n_shared_experts = 1;  // must be 1
    int moe_dim = 0;           // moe_intermediate_size
    int hc = 0;                // hc_mult (mHC streams)
    int hc_sinkhorn_iters = 20;
    double hc_eps = 1e-6;
    double norm_eps = 1e-6;     // rms_norm_eps
    double routed_scale = 1.0;  // routed_scaling_factor
    double swiglu_limit = 0.0;  // 0 = no clamp
    int index_n_heads = 0;
    int index_head_dim = 0;
    int index_topk = 0;
    int csa_ratio = 4;                  // compress_rates["compressed_sparse_attention"]
    int hca_ratio = 128;                // compress_rates["heavily_compressed_attention"]
    RopeParams rope_main;               // sliding-only layers
    RopeParams rope_compress;           // every rotation in CSA/HCA layers
    std::vector<AttnType> layer_types;  // n_layers entries
    std::vector<MlpType> mlp_types;     // n_layers entries
    int64_t bos_token_id = 0;           // -1 when the config says null
    int64_t eos_token_id = 1;           // the first one when the config lists several; -1 when null
    int64_t max_position_embeddings = 1048576;
    bool tie_word_embeddings = false;  // head.weight absent, the embedding is reused

    int ratio(int layer) const;  // 0 (sliding), csa_ratio or hca_ratio
    int nope_dim() const { return head_dim - rope_dim; }
};

// Parses config.json text. `source` names the file in error messages. Throws cpfill::Error naming
// the field, expected and found on a missing, mistyped or inconsistent field.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& path);
// Checks cross-field consistency (rope_dim <= head_dim, n_heads % o_groups == 0, list lengths,
// ...).
void validate_model_config(const ModelConfig& cfg, const std::string& source);
// Writes config.json in the HF form (names = "hf") or the official form (names = "upstream").
std::string model_config_to_json(const ModelConfig& cfg, const std::string& names);

}  // namespace cpfill
