// Weight table of a DeepSeek-V4 model (docs/architecture.md §6.2). Shapes for V4-Flash, e.g.:
// wq_a [1024, 4096], wq_b [32768, 1024], wo_a [8192, 4096] (o_groups·o_rank × per-group input),
// CSA compressor wkv [1024, 4096] (2·head_dim: overlapping windows), HCA compressor wkv
// [512, 4096], hc_attn_fn [24, 16384] ((2 + hc)·hc × hc·d_model).
#include "io/weight_specs.h"

#include "core/error.h"

namespace cpfill {

namespace {

struct Builder {
    std::vector<WeightSpec>& out;
    int layer;
    int expert = -1;
    void add(std::string name, Shape shape, WeightClass cls) {
        out.push_back({std::move(name), std::move(shape), cls, layer, expert});
    }
};

// The compressor of a CSA/HCA layer or of the CSA indexer: `width` = 2·dim for overlapping (CSA)
// windows, dim otherwise; ape has one row per slot of a window.
void add_compressor(Builder& b, const std::string& p, int64_t d_model, int64_t dim, int ratio,
                    bool overlap) {
    const int64_t width = overlap ? 2 * dim : dim;
    b.add(p + "wkv.weight", {width, d_model}, WeightClass::BF16);
    b.add(p + "wgate.weight", {width, d_model}, WeightClass::BF16);
    b.add(p + "ape", {ratio, width}, WeightClass::F32);
    b.add(p + "norm.weight", {dim}, WeightClass::BF16);
}

void add_layer(const ModelConfig& c, int i, std::vector<WeightSpec>& out) {
    Builder b{out, i};
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = c.d_model, hd = c.head_dim, H = c.n_heads, I = c.moe_dim;
    const int64_t mix = int64_t{2 + c.hc} * c.hc;
    for (const char* site : {"hc_attn", "hc_ffn"}) {
        b.add(p + site + "_fn", {mix, c.hc * D}, WeightClass::F32);
        b.add(p + site + "_base", {mix}, WeightClass::F32);
        b.add(p + site + "_scale", {3}, WeightClass::F32);
    }
    b.add(p + "attn_norm.weight", {D}, WeightClass::BF16);
    b.add(p + "ffn_norm.weight", {D}, WeightClass::BF16);

    const std::string a = p + "attn.";
    b.add(a + "attn_sink", {H}, WeightClass::F32);
    b.add(a + "wq_a.weight", {c.q_rank, D}, WeightClass::Fp8Linear);
    b.add(a + "q_norm.weight", {c.q_rank}, WeightClass::BF16);
    b.add(a + "wq_b.weight", {H * hd, c.q_rank}, WeightClass::Fp8Linear);
    b.add(a + "wkv.weight", {hd, D}, WeightClass::Fp8Linear);
    b.add(a + "kv_norm.weight", {hd}, WeightClass::BF16);
    b.add(a + "wo_a.weight", {int64_t{c.o_groups} * c.o_rank, H * hd / c.o_groups},
          WeightClass::Fp8Linear);
    b.add(a + "wo_b.weight", {D, int64_t{c.o_groups} * c.o_rank}, WeightClass::Fp8Linear);
    const AttnType t = c.layer_types.at(i);
    if (t != AttnType::Sliding)
        add_compressor(b, a + "compressor.", D, hd, c.ratio(i), t == AttnType::CSA);
    if (t == AttnType::CSA) {
        const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
        b.add(a + "indexer.wq_b.weight", {nI * dI, c.q_rank}, WeightClass::Fp8Linear);
        b.add(a + "indexer.weights_proj.weight", {nI, D}, WeightClass::BF16);
        add_compressor(b, a + "indexer.compressor.", D, dI, c.csa_ratio, true);
    }

    const std::string f = p + "ffn.";
    b.add(f + "gate.weight", {c.n_experts, D}, WeightClass::BF16);
    if (c.mlp_types.at(i) == MlpType::Hash)
        b.add(f + "gate.tid2eid", {c.vocab_size, c.top_k}, WeightClass::I64);
    else
        b.add(f + "gate.bias", {c.n_experts}, WeightClass::F32);
    b.add(f + "shared_experts.w1.weight", {I, D}, WeightClass::Fp8Linear);
    b.add(f + "shared_experts.w2.weight", {D, I}, WeightClass::Fp8Linear);
    b.add(f + "shared_experts.w3.weight", {I, D}, WeightClass::Fp8Linear);
    for (int e = 0; e < c.n_experts; ++e) {
        b.expert = e;
        const std::string x = f + "experts." + std::to_string(e) + ".";
        b.add(x + "w1.weight", {I, D}, WeightClass::Fp4Expert);
        b.add(x + "w2.weight", {D, I}, WeightClass::Fp4Expert);
        b.add(x + "w3.weight", {I, D}, WeightClass::Fp4Expert);
    }
}

}  // namespace

std::string_view weight_class_name(WeightClass c) {
    switch (c) {
        case WeightClass::Fp8Linear:
            return "fp8";
        case WeightClass::Fp4Expert:
            return "fp4";
        case WeightClass::BF16:
            return "bf16";
        case WeightClass::F32:
            return "f32";
        case WeightClass::I64:
            return "i64";
    }
    return "?";
}

std::vector<WeightSpec> layer_weight_specs(const ModelConfig& cfg, int layer) {
    CPFILL_CHECK(layer >= 0 && layer < cfg.n_layers, "layer {} out of range [0, {})", layer,
                 cfg.n_layers);
    std::vector<WeightSpec> out;
    add_layer(cfg, layer, out);
    return out;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& cfg) {
    std::vector<WeightSpec> out;
    const int64_t D = cfg.d_model;
    out.push_back({"embed.weight", {cfg.vocab_size, D}, WeightClass::BF16});
    for (int i = 0; i < cfg.n_layers; ++i) add_layer(cfg, i, out);
    out.push_back({"norm.weight", {D}, WeightClass::BF16});
    out.push_back({"head.weight", {cfg.vocab_size, D}, WeightClass::BF16});
    out.push_back({"hc_head_fn", {cfg.hc, cfg.hc * D}, WeightClass::F32});
    out.push_back({"hc_head_base", {cfg.hc}, WeightClass::F32});
    out.push_back({"hc_head_scale", {1}, WeightClass::F32});
    return out;
}

WeightSpecTable::WeightSpecTable(const ModelConfig& cfg) : specs_(weight_specs(cfg)) {
    index_.reserve(specs_.size());
    for (size_t i = 0; i < specs_.size(); ++i) index_.emplace(specs_[i].name, i);
}

const WeightSpec* WeightSpecTable::find(const std::string& canonical) const {
    auto it = index_.find(canonical);
    return it == index_.end() ? nullptr : &specs_[it->second];
}

const WeightSpec& WeightSpecTable::at(const std::string& canonical) const {
    const WeightSpec* s = find(canonical);
    CPFILL_CHECK(s != nullptr,
                 "\"{}\" is not a weight of this model (its config has no such "
                 "tensor: check the layer type, hash vs learned routing and the expert count)",
                 canonical);
    return *s;
}

bool is_expert_weight(const WeightSpec& spec) {
    return spec.expert >= 0 || spec.name.find(".shared_experts.") != std::string::npos;
}

}  // namespace cpfill
