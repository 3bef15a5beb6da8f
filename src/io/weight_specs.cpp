// Weight table of a DeepSeek-V4 model (docs/architecture.md §6.2). Shapes for V4-Flash, e.g.:
// wq_a [1024, 4096], wq_b [32768, 1024], wo_a [8192, 4096] (o_groups·o_rank × per-group input),
// CSA compressor wkv [1024, 4096] (2·head_dim: overlapping windows), HCA compressor wkv
// [512, 4096], hc_attn_fn [24, 16384] ((2 + hc)·hc × hc·d_model).
#include "io/weight_specs.h"

#include <cmath>

#include "core/error.h"

namespace cpfill {

namespace {

using S = WeightSlot;
using C = WeightClass;

// Random-weight distributions by family (io/random_checkpoint.h): linears, router gate and head
// N(0, 1/in); norms and mHC scales around 1; mHC mixing rows scaled down by 0.5.
WeightInit linear_init(int64_t in) { return {0.0, 1.0 / std::sqrt(static_cast<double>(in))}; }
constexpr WeightInit kNormInit{1.0, 0.1};

struct Builder {
    std::vector<WeightSpec>& out;
    int layer;
    int expert = -1;
    CpShard shard = CpShard::Replicated;
    void add(std::string name, Shape shape, WeightClass cls, WeightSlot slot, WeightInit init) {
        out.push_back({std::move(name), std::move(shape), cls, layer, expert, slot, shard, init});
    }
    void linear(std::string name, int64_t rows, int64_t in, WeightClass cls, WeightSlot slot) {
        add(std::move(name), {rows, in}, cls, slot, linear_init(in));
    }
    void norm(std::string name, int64_t n, WeightSlot slot) {
        add(std::move(name), {n}, C::BF16, slot, kNormInit);
    }
    // An mHC site: mixing rows [mix, in], their bias [mix] and `scales` gains.
    void mhc(const std::string& p, int64_t mix, int64_t in, int64_t scales, WeightSlot fn,
             WeightSlot base, WeightSlot scale) {
        add(p + "_fn", {mix, in}, C::F32, fn, {0.0, 0.5 / std::sqrt(static_cast<double>(in))});
        add(p + "_base", {mix}, C::F32, base, {0.0, 0.3});
        add(p + "_scale", {scales}, C::F32, scale, kNormInit);
    }
};

// The compressor of a CSA/HCA layer or of the CSA indexer: `width` = 2·dim for overlapping (CSA)
// windows, dim otherwise; ape has one row per slot of a window.
void add_compressor(Builder& b, const std::string& p, int64_t d_model, int64_t dim, int ratio,
                    bool overlap, bool indexer) {
    const int64_t width = overlap ? 2 * dim : dim;
    b.linear(p + "wkv.weight", width, d_model, C::BF16, indexer ? S::IdxCompWkv : S::CompWkv);
    b.linear(p + "wgate.weight", width, d_model, C::BF16, indexer ? S::IdxCompWgate : S::CompWgate);
    b.add(p + "ape", {ratio, width}, C::F32, indexer ? S::IdxCompApe : S::CompApe, {0.0, 0.5});
    b.norm(p + "norm.weight", dim, indexer ? S::IdxCompNorm : S::CompNorm);
}

// Expert `e`'s (−1: the shared expert's) SwiGLU matrices in layer `i`; CP ranks slice them over
// the hidden width (CpShard).
void add_expert(Builder& b, int i, int e, int64_t D, int64_t I, WeightClass cls) {
    b.shard = CpShard::HiddenRows;
    b.linear(expert_weight_name(i, e, S::W1), I, D, cls, S::W1);
    b.shard = CpShard::HiddenCols;
    b.linear(expert_weight_name(i, e, S::W2), D, I, cls, S::W2);
    b.shard = CpShard::HiddenRows;
    b.linear(expert_weight_name(i, e, S::W3), I, D, cls, S::W3);
    b.shard = CpShard::Replicated;
}

void add_layer(const ModelConfig& c, int i, std::vector<WeightSpec>& out) {
    Builder b{out, i};
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = c.d_model, hd = c.head_dim, H = c.n_heads, I = c.moe_dim;
    const int64_t mix = int64_t{2 + c.hc} * c.hc;
    b.mhc(p + "hc_attn", mix, c.hc * D, 3, S::HcAttnFn, S::HcAttnBase, S::HcAttnScale);
    b.mhc(p + "hc_ffn", mix, c.hc * D, 3, S::HcFfnFn, S::HcFfnBase, S::HcFfnScale);
    b.norm(p + "attn_norm.weight", D, S::AttnNorm);
    b.norm(p + "ffn_norm.weight", D, S::FfnNorm);

    const std::string a = p + "attn.";
    b.add(a + "attn_sink", {H}, C::F32, S::Sink, {0.0, 1.0});
    b.linear(a + "wq_a.weight", c.q_rank, D, C::Fp8Linear, S::WqA);
    b.norm(a + "q_norm.weight", c.q_rank, S::QNorm);
    b.linear(a + "wq_b.weight", H * hd, c.q_rank, C::Fp8Linear, S::WqB);
    b.linear(a + "wkv.weight", hd, D, C::Fp8Linear, S::Wkv);
    b.norm(a + "kv_norm.weight", hd, S::KvNorm);
    b.linear(a + "wo_a.weight", int64_t{c.o_groups} * c.o_rank, H * hd / c.o_groups, C::Fp8Linear,
             S::WoA);
    b.linear(a + "wo_b.weight", D, int64_t{c.o_groups} * c.o_rank, C::Fp8Linear, S::WoB);
    const AttnType t = c.layer_types.at(i);
    if (t != AttnType::Sliding)
        add_compressor(b, a + "compressor.", D, hd, c.ratio(i), t == AttnType::CSA, false);
    if (t == AttnType::CSA) {
        const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
        b.linear(a + "indexer.wq_b.weight", nI * dI, c.q_rank, C::Fp8Linear, S::IdxWqB);
        b.linear(a + "indexer.weights_proj.weight", nI, D, C::BF16, S::IdxWeightsProj);
        add_compressor(b, a + "indexer.compressor.", D, dI, c.csa_ratio, true, true);
    }

    const std::string f = p + "ffn.";
    b.linear(f + "gate.weight", c.n_experts, D, C::BF16, S::Gate);
    if (c.mlp_types.at(i) == MlpType::Hash)
        b.add(f + "gate.tid2eid", {c.vocab_size, c.top_k}, C::I64, S::Tid2eid, {});
    else
        b.add(f + "gate.bias", {c.n_experts}, C::F32, S::GateBias, {0.0, 0.05});
    add_expert(b, i, -1, D, I, C::Fp8Linear);
    for (int e = 0; e < c.n_experts; ++e) {
        b.expert = e;
        add_expert(b, i, e, D, I, C::Fp4Expert);
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
    Builder top{out, -1};
    top.add("embed.weight", {cfg.vocab_size, D}, C::BF16, S::Embed, {0.0, 1.0});
    for (int i = 0; i < cfg.n_layers; ++i) add_layer(cfg, i, out);
    top.norm("norm.weight", D, S::Norm);
    top.linear("head.weight", cfg.vocab_size, D, C::BF16, S::Head);
    top.mhc("hc_head", cfg.hc, cfg.hc * D, 1, S::HcHeadFn, S::HcHeadBase, S::HcHeadScale);
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

bool is_expert_weight(const WeightSpec& spec) { return spec.shard != CpShard::Replicated; }

std::string expert_weight_name(int layer, int expert, WeightSlot slot) {
    const char* m = slot == S::W1 ? "w1" : slot == S::W2 ? "w2" : "w3";
    CPFILL_CHECK(slot == S::W1 || slot == S::W2 || slot == S::W3,
                 "expert_weight_name: slot {} is not an expert matrix", static_cast<int>(slot));
    const std::string f = "layers." + std::to_string(layer) + ".ffn.";
    return expert < 0 ? f + "shared_experts." + m + ".weight"
                      : f + "experts." + std::to_string(expert) + "." + m + ".weight";
}

bool is_gemm_weight(const WeightSpec& spec) {
    return spec.shape.size() == 2 && spec.cls != WeightClass::F32 && spec.cls != WeightClass::I64;
}

}  // namespace cpfill
