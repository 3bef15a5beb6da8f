// Presets. flash / pro follow the shipped config.json files: layer types from compress_ratios
// without the MTP entry, hash routing on layers 0-2, compress RoPE θ=160000 with YaRN (factor 16
// over 65536 positions, β 32/1, no mscale), main RoPE θ=10000 plain.
#include "io/presets.h"

#include <fmt/ranges.h>

#include "core/error.h"

namespace cpfill {

namespace {

void set_rope(ModelConfig& c) {
    c.rope_main = RopeParams{};
    c.rope_main.theta = 10000.0;
    c.rope_compress = RopeParams{};
    c.rope_compress.theta = 160000.0;
    c.rope_compress.yarn = true;
    c.rope_compress.factor = 16.0;
    c.rope_compress.original_max_pos = 65536;
    c.rope_compress.beta_fast = 32.0;
    c.rope_compress.beta_slow = 1.0;
    c.rope_compress.attention_factor = 1.0;
    c.max_position_embeddings = 1048576;
}

void set_hash_prefix(ModelConfig& c, int n_hash) {
    c.mlp_types.clear();
    for (int i = 0; i < c.n_layers; ++i)
        c.mlp_types.push_back(i < n_hash ? MlpType::Hash : MlpType::Learned);
}

// Shared by both releases (§1).
ModelConfig release_common() {
    ModelConfig c;
    c.vocab_size = 129280;
    c.head_dim = 512;
    c.rope_dim = 64;
    c.o_rank = 1024;
    c.window = 128;
    c.top_k = 6;
    c.n_shared_experts = 1;
    c.hc = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.norm_eps = 1e-6;
    c.swiglu_limit = 10.0;
    c.index_n_heads = 64;
    c.index_head_dim = 128;
    c.csa_ratio = 4;
    c.hca_ratio = 128;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
    set_rope(c);
    return c;
}

// V4-Flash: layers 0, 1 sliding; then CSA on even, HCA on odd layers.
ModelConfig flash(int n_layers) {
    ModelConfig c = release_common();
    c.d_model = 4096;
    c.n_layers = n_layers;
    c.n_heads = 64;
    c.q_rank = 1024;
    c.o_groups = 8;
    c.n_experts = 256;
    c.moe_dim = 2048;
    c.routed_scale = 1.5;
    c.index_topk = 512;
    for (int i = 0; i < n_layers; ++i)
        c.layer_types.push_back(i < 2 ? AttnType::Sliding
                                      : (i % 2 == 0 ? AttnType::CSA : AttnType::HCA));
    set_hash_prefix(c, 3);
    return c;
}

// V4-Pro: layers 0, 1 HCA; then CSA on even, HCA on odd layers (no sliding-only layer).
ModelConfig pro(int n_layers) {
    ModelConfig c = release_common();
    c.d_model = 7168;
    c.n_layers = n_layers;
    c.n_heads = 128;
    c.q_rank = 1536;
    c.o_groups = 16;
    c.n_experts = 384;
    c.moe_dim = 3072;
    c.routed_scale = 2.5;
    c.index_topk = 1024;
    for (int i = 0; i < n_layers; ++i)
        c.layer_types.push_back(i >= 2 && i % 2 == 0 ? AttnType::CSA : AttnType::HCA);
    set_hash_prefix(c, 3);
    return c;
}

// Small but architecturally complete: head_dim 512 / rope 64 / window 128 as released; layer
// types sliding, CSA, HCA, CSA with hash routing on layers 0-1 (so hash and learned routing both
// meet a compressed layer); index_topk 16 so a 200-token prompt (50 CSA entries) is sparse.
ModelConfig tiny() {
    ModelConfig c = release_common();
    c.vocab_size = 512;
    c.d_model = 256;
    c.n_layers = 4;
    c.n_heads = 8;
    c.q_rank = 128;
    c.o_groups = 2;
    c.o_rank = 128;
    c.n_experts = 8;
    c.top_k = 2;
    c.moe_dim = 128;
    c.routed_scale = 1.5;
    c.index_n_heads = 4;
    c.index_head_dim = 128;
    c.index_topk = 16;
    c.layer_types = {AttnType::Sliding, AttnType::CSA, AttnType::HCA, AttnType::CSA};
    set_hash_prefix(c, 2);
    return c;
}

// tiny with DeepSeek's vocabulary (129,280 ids, as released: the tokenizer's 128,815 padded), so
// that text prompts run on it; d_model 128 keeps the embedding and head at 33 M parameters
// (132 MB in fp32 for both), the rest is tiny's.
ModelConfig tiny_text() {
    ModelConfig c = tiny();
    c.vocab_size = release_common().vocab_size;
    c.d_model = 128;
    return c;
}

}  // namespace

std::vector<std::string> preset_names() {
    return {"tiny", "tiny-text", "flash", "pro", "flash-slice", "pro-slice"};
}

ModelConfig preset_config(const std::string& name) {
    ModelConfig c;
    if (name == "tiny")
        c = tiny();
    else if (name == "tiny-text")
        c = tiny_text();
    else if (name == "flash")
        c = flash(43);
    else if (name == "pro")
        c = pro(61);
    else if (name == "flash-slice")
        c = flash(4);  // sliding, sliding, CSA, HCA; hash on 0-2, learned on 3
    else if (name == "pro-slice")
        c = pro(4);  // HCA, HCA, CSA, HCA; hash on 0-2, learned on 3 (Pro has no sliding layer)
    else
        CPFILL_FAIL("unknown preset \"{}\": expected one of {}", name,
                    fmt::join(preset_names(), ", "));
    validate_model_config(c, "preset " + name);
    return c;
}

}  // namespace cpfill
