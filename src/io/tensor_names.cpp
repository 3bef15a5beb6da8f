// The name table: one row per tensor family, as templates with {L} (layer) and {E} (expert).
#include "io/tensor_names.h"

#include <unordered_map>

#include "core/error.h"

namespace cpfill {

namespace {

struct Row {
    const char* upstream;
    const char* hf_saved;
    const char* hf_module;
    StackPart part = StackPart::Whole;  // != Whole: hf_module is the stacked [E, ...] tensor
    const char* hf_module_alt = nullptr;
};

#define L_ "layers.{L}."
#define S_ "model.layers.{L}."
// clang-format off
const Row kRows[] = {
    {"embed.weight", "model.embed_tokens.weight", "model.embed_tokens.weight"},
    {"head.weight", "head.weight", "lm_head.weight"},
    {"norm.weight", "model.norm.weight", "model.norm.weight"},
    {"hc_head_fn", "model.hc_head.hc_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base", "model.hc_head.hc_base"},
    {"hc_head_scale", "model.hc_head.hc_scale", "model.hc_head.hc_scale"},
    {L_ "hc_attn_fn", S_ "hc_attn_fn", S_ "attn_hc.fn"},
    {L_ "hc_attn_base", S_ "hc_attn_base", S_ "attn_hc.base"},
    {L_ "hc_attn_scale", S_ "hc_attn_scale", S_ "attn_hc.scale"},
    {L_ "hc_ffn_fn", S_ "hc_ffn_fn", S_ "ffn_hc.fn"},
    {L_ "hc_ffn_base", S_ "hc_ffn_base", S_ "ffn_hc.base"},
    {L_ "hc_ffn_scale", S_ "hc_ffn_scale", S_ "ffn_hc.scale"},
    {L_ "attn_norm.weight", S_ "attn_norm.weight", S_ "input_layernorm.weight"},
    {L_ "ffn_norm.weight", S_ "ffn_norm.weight", S_ "post_attention_layernorm.weight"},
    {L_ "attn.attn_sink", S_ "attn.attn_sink", S_ "self_attn.sinks"},
    {L_ "attn.wq_a.weight", S_ "attn.wq_a.weight", S_ "self_attn.q_a_proj.weight"},
    {L_ "attn.q_norm.weight", S_ "attn.q_norm.weight", S_ "self_attn.q_a_norm.weight"},
    {L_ "attn.wq_b.weight", S_ "attn.wq_b.weight", S_ "self_attn.q_b_proj.weight"},
    {L_ "attn.wkv.weight", S_ "attn.wkv.weight", S_ "self_attn.kv_proj.weight"},
    {L_ "attn.kv_norm.weight", S_ "attn.norm.weight", S_ "self_attn.kv_norm.weight"},
    {L_ "attn.wo_a.weight", S_ "attn.wo_a.weight", S_ "self_attn.o_a_proj.weight"},
    {L_ "attn.wo_b.weight", S_ "attn.wo_b.weight", S_ "self_attn.o_b_proj.weight"},
    {L_ "attn.compressor.wkv.weight", S_ "attn.compressor.wkv.weight",
     S_ "self_attn.compressor.kv_proj.weight"},
    {L_ "attn.compressor.wgate.weight", S_ "attn.compressor.wgate.weight",
     S_ "self_attn.compressor.gate_proj.weight"},
    {L_ "attn.compressor.ape", S_ "attn.compressor.ape", S_ "self_attn.compressor.position_bias"},
    {L_ "attn.compressor.norm.weight", S_ "attn.compressor.norm.weight",
     S_ "self_attn.compressor.kv_norm.weight"},
    {L_ "attn.indexer.wq_b.weight", S_ "attn.indexer.wq_b.weight",
     S_ "self_attn.compressor.indexer.q_b_proj.weight"},
    // Older HF modeling had no `scorer` submodule.
    {L_ "attn.indexer.weights_proj.weight", S_ "attn.indexer.weights_proj.weight",
     S_ "self_attn.compressor.indexer.scorer.weights_proj.weight", StackPart::Whole,
     S_ "self_attn.compressor.indexer.weights_proj.weight"},
    {L_ "attn.indexer.compressor.wkv.weight", S_ "attn.indexer.compressor.wkv.weight",
     S_ "self_attn.compressor.indexer.kv_proj.weight"},
    {L_ "attn.indexer.compressor.wgate.weight", S_ "attn.indexer.compressor.wgate.weight",
     S_ "self_attn.compressor.indexer.gate_proj.weight"},
    {L_ "attn.indexer.compressor.ape", S_ "attn.indexer.compressor.ape",
     S_ "self_attn.compressor.indexer.position_bias"},
    {L_ "attn.indexer.compressor.norm.weight", S_ "attn.indexer.compressor.norm.weight",
     S_ "self_attn.compressor.indexer.kv_norm.weight"},
    {L_ "ffn.gate.weight", S_ "ffn.gate.weight", S_ "mlp.gate.weight"},
    {L_ "ffn.gate.bias", S_ "ffn.gate.bias", S_ "mlp.gate.e_score_correction_bias"},
    {L_ "ffn.gate.tid2eid", S_ "ffn.gate.tid2eid", S_ "mlp.gate.tid2eid"},
    {L_ "ffn.shared_experts.w1.weight", S_ "ffn.shared_experts.w1.weight",
     S_ "mlp.shared_experts.gate_proj.weight"},
    {L_ "ffn.shared_experts.w2.weight", S_ "ffn.shared_experts.w2.weight",
     S_ "mlp.shared_experts.down_proj.weight"},
    {L_ "ffn.shared_experts.w3.weight", S_ "ffn.shared_experts.w3.weight",
     S_ "mlp.shared_experts.up_proj.weight"},
    {L_ "ffn.experts.{E}.w1.weight", S_ "ffn.experts.{E}.w1.weight", S_ "mlp.experts.gate_up_proj",
     StackPart::FirstHalf},
    {L_ "ffn.experts.{E}.w2.weight", S_ "ffn.experts.{E}.w2.weight", S_ "mlp.experts.down_proj",
     StackPart::Whole},
    {L_ "ffn.experts.{E}.w3.weight", S_ "ffn.experts.{E}.w3.weight", S_ "mlp.experts.gate_up_proj",
     StackPart::SecondHalf},
};
// clang-format on
#undef L_
#undef S_

bool is_expert_row(const Row& r) {
    return std::string_view(r.upstream).find("{E}") != std::string_view::npos;
}

// A name with its layer and expert numbers replaced by {L} and {E}.
struct Template {
    std::string text;
    int layer = -1;
    int expert = -1;
};

std::optional<int> small_number(std::string_view s) {
    if (s.empty() || s.size() > 9) return std::nullopt;
    int v = 0;
    for (char ch : s) {
        if (ch < '0' || ch > '9') return std::nullopt;
        v = v * 10 + (ch - '0');
    }
    return v;
}

Template templatize(const std::string& name) {
    Template t;
    std::string_view prev;
    size_t start = 0;
    while (start <= name.size()) {
        size_t dot = name.find('.', start);
        if (dot == std::string::npos) dot = name.size();
        std::string_view part(name.data() + start, dot - start);
        auto num = small_number(part);
        if (num && prev == "layers" && t.layer < 0) {
            t.layer = *num;
            t.text += "{L}";
        } else if (num && prev == "experts" && t.expert < 0) {
            t.expert = *num;
            t.text += "{E}";
        } else {
            t.text += part;
        }
        if (dot < name.size()) t.text += '.';
        prev = part;
        start = dot + 1;
    }
    return t;
}

std::string fill(std::string_view tmpl, int layer, int expert) {
    std::string out;
    for (size_t i = 0; i < tmpl.size(); ++i) {
        if (tmpl.substr(i, 3) == "{L}") {
            out += std::to_string(layer);
            i += 2;
        } else if (tmpl.substr(i, 3) == "{E}") {
            out += std::to_string(expert);
            i += 2;
        } else {
            out += tmpl[i];
        }
    }
    return out;
}

const char* row_name(const Row& r, Naming n) {
    switch (n) {
        case Naming::Upstream:
            return r.upstream;
        case Naming::HfSaved:
            return r.hf_saved;
        case Naming::HfModule:
            return r.hf_module;
    }
    return r.upstream;
}

// Template → row, per naming (the hf-module map leaves out stacked expert rows).
const std::unordered_map<std::string, const Row*>& index(Naming n) {
    static const auto build = [](Naming n) {
        std::unordered_map<std::string, const Row*> m;
        for (const Row& r : kRows) {
            if (n == Naming::HfModule && r.part != StackPart::Whole) continue;
            if (n == Naming::HfModule && is_expert_row(r)) continue;
            m.emplace(row_name(r, n), &r);
            if (n == Naming::HfModule && r.hf_module_alt) m.emplace(r.hf_module_alt, &r);
        }
        return m;
    };
    static const std::unordered_map<std::string, const Row*> maps[3] = {
        build(Naming::Upstream), build(Naming::HfSaved), build(Naming::HfModule)};
    return maps[static_cast<int>(n)];
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::string_view naming_name(Naming n) {
    switch (n) {
        case Naming::Upstream:
            return "upstream";
        case Naming::HfSaved:
            return "hf-saved";
        case Naming::HfModule:
            return "hf-module";
    }
    return "?";
}

std::optional<Naming> parse_naming(std::string_view s) {
    for (Naming n : {Naming::Upstream, Naming::HfSaved, Naming::HfModule})
        if (naming_name(n) == s) return n;
    return std::nullopt;
}

StoredName stored_name(const std::string& canonical, Naming naming) {
    Template t = templatize(canonical);
    auto it = index(Naming::Upstream).find(t.text);
    CPFILL_CHECK(it != index(Naming::Upstream).end(), "\"{}\" is not a DeepSeek-V4 tensor name",
                 canonical);
    const Row& r = *it->second;
    StoredName s;
    if (naming == Naming::HfModule && is_expert_row(r)) {
        s.name = fill(r.hf_module, t.layer, t.expert);
        s.expert = t.expert;
        s.part = r.part;
        return s;
    }
    s.name = fill(row_name(r, naming), t.layer, t.expert);
    if (naming == Naming::HfModule && r.hf_module_alt)
        s.alternates.push_back(fill(r.hf_module_alt, t.layer, t.expert));
    return s;
}

std::optional<std::string> canonical_name(const std::string& stored, Naming naming) {
    Template t = templatize(stored);
    const auto& m = index(naming);
    auto it = m.find(t.text);
    if (it == m.end()) return std::nullopt;
    return fill(it->second->upstream, t.layer, t.expert);
}

std::vector<std::string> scale_names(const std::string& w, Naming naming) {
    const std::string_view suffix = ".weight";
    if (w.size() > suffix.size() &&
        w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0) {
        const std::string base = w.substr(0, w.size() - suffix.size());
        if (naming == Naming::HfModule) return {w + "_scale_inv", base + ".scale"};
        return {base + ".scale", w + "_scale_inv"};
    }
    return {w + "_scale_inv", w + ".scale", w + "_scale"};  // stacked HF parameters
}

std::string scale_name(const std::string& stored_weight, Naming naming) {
    return scale_names(stored_weight, naming).front();
}

std::optional<Naming> detect_naming(const std::vector<std::string>& names) {
    bool any_model = false;
    for (const std::string& n : names) {
        if (n == "embed.weight" || starts_with(n, "layers.")) return Naming::Upstream;
        if (n == "lm_head.weight") return Naming::HfModule;
        if (starts_with(n, "model.layers.") &&
            (n.find(".self_attn.") != std::string::npos || n.find(".mlp.") != std::string::npos))
            return Naming::HfModule;
        any_model |= starts_with(n, "model.");
    }
    if (any_model) return Naming::HfSaved;
    return std::nullopt;
}

}  // namespace cpfill
