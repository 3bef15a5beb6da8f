// config.json → ModelConfig and back. Accepts the HF form written by transformers 5.17
// (layer_types, mlp_layer_types, compress_rates, rope_parameters {main, compress}), the hub
// config.json of the releases (HF names plus the legacy keys compress_ratios, num_hash_layers,
// qk_rope_head_dim, rope_scaling) and the reference `inference/config.json` (dim, n_layers,
// n_heads, moe_inter_dim, rope_factor, original_seq_len, ...). Every field is looked up under its
// HF name first, then under its legacy/reference aliases. The legacy folding follows
// DeepseekV4Config.__post_init__ (configuration_deepseek_v4.py) step by step; see
// docs/architecture.md §1–§2. Stricter than HF in one respect: explicit layer_types /
// mlp_layer_types must have exactly num_hidden_layers entries (HF truncates longer lists
// silently); compress_ratios may carry the extra MTP entries of the release.
#include "io/model_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/json_excerpt.h"

namespace cpfill {

namespace {

using json = nlohmann::json;
using Keys = std::initializer_list<std::string_view>;

constexpr int64_t kMaxCount = 1 << 20;  // bound on layer/head/expert counts (guards allocations)
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;  // fits an int

std::string json_kind(const json& v) {
    switch (v.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::boolean:
            return "a boolean";
        case json::value_t::string:
            return "a string";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
            return "an integer";
        case json::value_t::number_float:
            return "a number";
        case json::value_t::array:
            return "a list";
        case json::value_t::object:
            return "an object";
        default:
            return "an unknown value";
    }
}

std::string show(const json& v) {
    return fmt::format("{} ({})", json_excerpt(v, 60), json_kind(v));
}

// Typed access to one JSON object; every error names the field (with its path), what was
// expected, what was found and the file.
class Reader {
  public:
    Reader(const json& obj, const std::string& source, std::string path = "")
        : obj_(obj), source_(source), path_(std::move(path)) {}

    const json& obj() const { return obj_; }
    const std::string& source() const { return source_; }
    // A reader for the object under `key` (which must be one).
    Reader sub(std::string_view key) const {
        const json& v = obj_.at(std::string(key));
        if (!v.is_object()) fail(key, "an object", show(v));
        return Reader(v, source_, field(key) + ".");
    }
    std::string field(std::string_view key) const { return path_ + std::string(key); }

    // The first of `keys` present with a non-null value; nullptr when none is.
    const json* find(Keys keys, std::string* found_key = nullptr) const {
        for (std::string_view k : keys) {
            auto it = obj_.find(std::string(k));
            if (it != obj_.end() && !it->is_null()) {
                if (found_key) *found_key = std::string(k);
                return &*it;
            }
        }
        return nullptr;
    }
    bool has(Keys keys) const { return find(keys) != nullptr; }

    [[noreturn]] void fail(std::string_view key, std::string_view expected,
                           const std::string& found) const {
        CPFILL_FAIL("{}: config field \"{}\": expected {}, found {}", source_, field(key), expected,
                    found);
    }
    [[noreturn]] void missing(Keys keys, std::string_view expected) const {
        std::string names;
        for (std::string_view k : keys)
            names += (names.empty() ? "\"" : " (or \"") + field(k) + (names.empty() ? "\"" : "\")");
        CPFILL_FAIL("{}: config field {} is missing: expected {}", source_, names, expected);
    }

    int64_t as_int(const json& v, std::string_view key, int64_t lo, int64_t hi) const {
        const std::string range = fmt::format("an integer in [{}, {}]", lo, hi);
        if (!v.is_number_integer()) fail(key, range, show(v));
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
            fail(key, range, show(v));
        int64_t x = v.get<int64_t>();
        if (x < lo || x > hi) fail(key, range, show(v));
        return x;
    }
    double as_number(const json& v, std::string_view key) const {
        if (!v.is_number()) fail(key, "a number", show(v));
        return v.get<double>();
    }
    std::string as_string(const json& v, std::string_view key) const {
        if (!v.is_string()) fail(key, "a string", show(v));
        return v.get<std::string>();
    }
    bool as_bool(const json& v, std::string_view key) const {
        if (!v.is_boolean()) fail(key, "true or false", show(v));
        return v.get<bool>();
    }

    // Required when `def` is nullopt.
    int64_t get_int(Keys keys, std::optional<int64_t> def, int64_t lo, int64_t hi) const {
        std::string k;
        if (const json* v = find(keys, &k)) return as_int(*v, k, lo, hi);
        if (!def) missing(keys, fmt::format("an integer in [{}, {}]", lo, hi));
        return *def;
    }
    double get_number(Keys keys, std::optional<double> def) const {
        std::string k;
        if (const json* v = find(keys, &k)) return as_number(*v, k);
        if (!def) missing(keys, "a number");
        return *def;
    }
    bool get_bool(Keys keys, bool def) const {
        std::string k;
        if (const json* v = find(keys, &k)) return as_bool(*v, k);
        return def;
    }
    std::string get_string(Keys keys, std::string def) const {
        std::string k;
        if (const json* v = find(keys, &k)) return as_string(*v, k);
        return def;
    }
    // A field that must have one fixed value when present (HF features cpfill does not support).
    template <class T>
    void expect_value(Keys keys, const T& want, std::string_view why) const {
        std::string k;
        const json* v = find(keys, &k);
        if (!v) return;
        bool ok = false;
        if constexpr (std::is_same_v<T, bool>)
            ok = v->is_boolean() && v->get<bool>() == want;
        else if constexpr (std::is_integral_v<T>)
            ok = v->is_number_integer() && v->get<int64_t>() == want;
        else
            ok = v->is_string() && v->get<std::string>() == want;
        if (!ok) fail(k, fmt::format("{} ({})", json(want).dump(), why), show(*v));
    }

  private:
    const json& obj_;
    const std::string& source_;
    std::string path_;
};

int as_count(int64_t x) { return static_cast<int>(x); }

std::optional<AttnType> attn_type_from_name(std::string_view s) {
    for (AttnType t : {AttnType::Sliding, AttnType::CSA, AttnType::HCA})
        if (attn_type_name(t) == s) return t;
    return std::nullopt;
}

std::optional<MlpType> mlp_type_from_name(std::string_view s) {
    for (MlpType t : {MlpType::Hash, MlpType::Learned})
        if (mlp_type_name(t) == s) return t;
    return std::nullopt;
}

double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// One rope table from a rope-parameters dict (a nested main/compress sub-dict, or the flat legacy
// dict). `folded`: the dict came from rope_scaling / a flat rope_parameters, where V4's
// __post_init__ injects attention_factor = 1.0 for yarn. `theta` is the base to use when the dict
// has none (HF: the top-level rope_theta).
RopeParams parse_rope_dict(const Reader& r, double theta, int64_t max_pos, bool folded) {
    RopeParams p;
    std::string type = r.get_string({"rope_type", "type"}, "default");
    if (type != "default" && type != "yarn")
        r.fail(r.has({"rope_type"}) ? "rope_type" : "type", "\"default\" or \"yarn\"",
               show(json(type)));
    p.theta = r.get_number({"rope_theta"}, theta);
    if (!(p.theta > 1.0)) r.fail("rope_theta", "a number > 1", show(json(p.theta)));
    if (const json* t = r.find({"truncate"})) r.as_bool(*t, "truncate");  // type only; see header
    p.truncate = true;
    if (type == "default") return p;
    p.yarn = true;
    p.original_max_pos =
        static_cast<double>(r.get_int({"original_max_position_embeddings"}, max_pos, 1, kMaxDim));
    p.factor = r.get_number({"factor"}, static_cast<double>(max_pos) / p.original_max_pos);
    if (!(p.factor > 0)) r.fail("factor", "a number > 0", show(json(p.factor)));
    // Python's `get("beta_fast") or 32`: a 0 also falls back to the default.
    p.beta_fast = r.get_number({"beta_fast"}, 32.0);
    if (p.beta_fast == 0) p.beta_fast = 32.0;
    p.beta_slow = r.get_number({"beta_slow"}, 1.0);
    if (p.beta_slow == 0) p.beta_slow = 1.0;
    if (const json* a = r.find({"attention_factor"})) {
        p.attention_factor = r.as_number(*a, "attention_factor");
    } else if (folded) {
        p.attention_factor = 1.0;
    } else {
        double ms = r.get_number({"mscale"}, 0.0), ms_all = r.get_number({"mscale_all_dim"}, 0.0);
        p.attention_factor = (ms != 0 && ms_all != 0)
                                 ? yarn_mscale(p.factor, ms) / yarn_mscale(p.factor, ms_all)
                                 : yarn_mscale(p.factor, 1.0);
    }
    return p;
}

// rope_main / rope_compress following __post_init__: an already nested {main, compress} dict is
// taken as is; otherwise the flat dict (rope_scaling wins over rope_parameters, as in HF's
// convert_rope_params_to_dict) becomes the compress table with theta = compress_rope_theta, and
// main is plain RoPE with theta = rope_theta. The reference form spells the yarn knobs as
// top-level rope_factor / original_seq_len / beta_fast / beta_slow (yarn iff original_seq_len > 0).
void parse_rope(const Reader& r, bool reference_form, double prf, ModelConfig& c) {
    const double theta_main = r.get_number({"rope_theta"}, 10000.0);
    const double theta_compress =
        r.get_number({"compress_rope_theta"}, reference_form ? 40000.0 : 160000.0);
    const int64_t max_pos = c.max_position_embeddings;
    auto check_prf = [&](const Reader& d) {
        if (const json* v = d.find({"partial_rotary_factor"})) {
            if (d.as_number(*v, "partial_rotary_factor") != prf)
                d.fail("partial_rotary_factor",
                       fmt::format("{} (the model's partial_rotary_factor)", prf), show(*v));
        }
    };

    std::string key;
    const json* rp = r.find({"rope_scaling"}, &key);
    if (rp && rp->is_object() && rp->empty()) rp = nullptr;  // Python: `rope_scaling or ...`
    if (!rp) rp = r.find({"rope_parameters"}, &key);
    if (rp && !rp->is_object()) r.fail(key, "an object", show(*rp));

    if (rp && rp->contains("main") && rp->contains("compress") && (*rp)["main"].is_object() &&
        (*rp)["compress"].is_object()) {
        Reader d = r.sub(key);
        Reader dm = d.sub("main"), dc = d.sub("compress");
        check_prf(dm);
        check_prf(dc);
        // Nested sub-dicts without rope_theta get the top-level rope_theta (HF's defaulting).
        c.rope_main = parse_rope_dict(dm, theta_main, max_pos, false);
        c.rope_compress = parse_rope_dict(dc, theta_main, max_pos, false);
        return;
    }
    c.rope_main = RopeParams{};
    c.rope_main.theta = theta_main;
    if (rp) {
        Reader d = r.sub(key);
        check_prf(d);
        c.rope_compress = parse_rope_dict(d, theta_compress, max_pos, true);
        c.rope_compress.theta = theta_compress;  // __post_init__ overrides it
        return;
    }
    c.rope_compress = RopeParams{};
    c.rope_compress.theta = theta_compress;
    if (reference_form && r.get_int({"original_seq_len"}, 0, 0, kMaxDim) > 0) {
        RopeParams& p = c.rope_compress;
        p.yarn = true;
        p.original_max_pos = static_cast<double>(r.get_int({"original_seq_len"}, 0, 0, kMaxDim));
        p.factor = r.get_number({"rope_factor"}, 40.0);
        p.beta_fast = r.get_number({"beta_fast"}, 32.0);
        p.beta_slow = r.get_number({"beta_slow"}, 1.0);
        p.attention_factor = 1.0;
    }
}

// compress_rates (+ legacy compress_rate_csa / compress_rate_hca), then layer_types, else the
// legacy per-layer compress_ratios (0 / csa / hca; one extra trailing entry per MTP block).
void parse_layer_types(const Reader& r, ModelConfig& c) {
    const std::string kCsa(attn_type_name(AttnType::CSA)), kHca(attn_type_name(AttnType::HCA));
    if (r.has({"compress_rates"})) {
        Reader d = r.sub("compress_rates");
        c.csa_ratio = as_count(d.get_int({kCsa}, std::nullopt, 1, kMaxCount));
        c.hca_ratio = as_count(d.get_int({kHca}, std::nullopt, 1, kMaxCount));
    }
    c.csa_ratio = as_count(r.get_int({"compress_rate_csa"}, c.csa_ratio, 1, kMaxCount));
    c.hca_ratio = as_count(r.get_int({"compress_rate_hca"}, c.hca_ratio, 1, kMaxCount));
    if (c.csa_ratio == c.hca_ratio)
        r.fail("compress_rates", "different CSA and HCA compression rates",
               fmt::format("both {}", c.csa_ratio));
    const size_t n = static_cast<size_t>(c.n_layers);
    std::string key;
    if (const json* lt = r.find({"layer_types"}, &key)) {
        if (!lt->is_array()) r.fail(key, "a list of layer type names", show(*lt));
        if (lt->size() != n)
            r.fail(key, fmt::format("{} entries (num_hidden_layers)", n),
                   fmt::format("{} entries", lt->size()));
        for (size_t i = 0; i < n; ++i) {
            const json& v = (*lt)[i];
            auto t = v.is_string() ? attn_type_from_name(v.get<std::string>()) : std::nullopt;
            if (!t)
                r.fail(fmt::format("{}[{}]", key, i),
                       "one of sliding_attention, compressed_sparse_attention, "
                       "heavily_compressed_attention",
                       show(v));
            c.layer_types.push_back(*t);
        }
        return;
    }
    const json* cr = r.find({"compress_ratios"}, &key);
    if (!cr)
        r.missing({"layer_types", "compress_ratios"},
                  "the per-layer attention types (HF's default pattern matches neither release)");
    if (!cr->is_array()) r.fail(key, "a list of integers", show(*cr));
    const size_t n_mtp = static_cast<size_t>(
        r.get_int({"num_nextn_predict_layers", "n_mtp_layers"}, 1, 0, kMaxCount));
    if (cr->size() != n && cr->size() != n + n_mtp)
        r.fail(key, fmt::format("{} entries (n_layers) or {} (n_layers + MTP)", n, n + n_mtp),
               fmt::format("{} entries", cr->size()));
    for (size_t i = 0; i < n; ++i) {
        const std::string k = fmt::format("{}[{}]", key, i);
        int64_t ratio = r.as_int((*cr)[i], k, 0, kMaxCount);
        if (ratio == 0)
            c.layer_types.push_back(AttnType::Sliding);
        else if (ratio == c.csa_ratio)
            c.layer_types.push_back(AttnType::CSA);
        else if (ratio == c.hca_ratio)
            c.layer_types.push_back(AttnType::HCA);
        else
            r.fail(k, fmt::format("0, {} or {}", c.csa_ratio, c.hca_ratio), show((*cr)[i]));
    }
}

// mlp_layer_types, else the first num_hash_layers layers hash-routed.
void parse_mlp_types(const Reader& r, bool reference_form, ModelConfig& c) {
    const size_t n = static_cast<size_t>(c.n_layers);
    std::string key;
    if (const json* mt = r.find({"mlp_layer_types"}, &key)) {
        if (!mt->is_array()) r.fail(key, "a list of \"hash_moe\" / \"moe\"", show(*mt));
        if (mt->size() != n)
            r.fail(key, fmt::format("{} entries (num_hidden_layers)", n),
                   fmt::format("{} entries", mt->size()));
        for (size_t i = 0; i < n; ++i) {
            const json& v = (*mt)[i];
            auto t = v.is_string() ? mlp_type_from_name(v.get<std::string>()) : std::nullopt;
            if (!t) r.fail(fmt::format("{}[{}]", key, i), "\"hash_moe\" or \"moe\"", show(v));
            c.mlp_types.push_back(*t);
        }
        return;
    }
    int64_t n_hash =
        r.get_int({"num_hash_layers", "n_hash_layers"}, reference_form ? 0 : 3, 0, kMaxCount);
    for (size_t i = 0; i < n; ++i)
        c.mlp_types.push_back(static_cast<int64_t>(i) < n_hash ? MlpType::Hash : MlpType::Learned);
}

int64_t parse_token_id(const Reader& r, std::string_view key, int64_t def) {
    const json* v = r.find({key});
    if (!v) return r.obj().contains(std::string(key)) ? -1 : def;  // null → none
    if (v->is_array()) {
        if (v->empty()) return -1;
        return r.as_int((*v)[0], fmt::format("{}[0]", key), 0, kMaxDim);
    }
    return r.as_int(*v, key, 0, kMaxDim);
}

ModelConfig parse_fields(const Reader& r) {
    ModelConfig c;
    // The reference inference/config.json has `dim` and none of the HF names; its defaults are
    // those of inference/model.py's ModelArgs.
    const bool ref = !r.has({"hidden_size"}) && r.has({"dim"});
    r.expect_value({"model_type"}, std::string("deepseek_v4"), "a DeepSeek-V4 config");
    c.vocab_size = r.get_int({"vocab_size"}, std::nullopt, 1, kMaxDim);
    c.d_model = r.get_int({"hidden_size", "dim"}, std::nullopt, 1, kMaxDim);
    c.n_layers = as_count(r.get_int({"num_hidden_layers", "n_layers"}, std::nullopt, 1, kMaxCount));
    c.n_heads = as_count(r.get_int({"num_attention_heads", "n_heads"}, std::nullopt, 1, kMaxCount));
    r.expect_value({"num_key_value_heads", "n_kv_heads"}, int64_t{1}, "V4 shares one K=V head");
    c.head_dim = as_count(r.get_int({"head_dim"}, std::nullopt, 1, kMaxCount));
    c.q_rank = as_count(r.get_int({"q_lora_rank"}, std::nullopt, 1, kMaxDim));
    c.o_groups = as_count(r.get_int({"o_groups"}, std::nullopt, 1, kMaxCount));
    c.o_rank = as_count(r.get_int({"o_lora_rank"}, std::nullopt, 1, kMaxDim));
    c.window = as_count(r.get_int({"sliding_window", "window_size"}, 128, 1, kMaxDim));
    c.n_experts = as_count(r.get_int({"n_routed_experts"}, std::nullopt, 1, kMaxCount));
    c.top_k = as_count(
        r.get_int({"num_experts_per_tok", "n_activated_experts"}, std::nullopt, 1, kMaxCount));
    c.n_shared_experts = as_count(r.get_int({"n_shared_experts"}, 1, 0, kMaxCount));
    c.moe_dim =
        as_count(r.get_int({"moe_intermediate_size", "moe_inter_dim"}, std::nullopt, 1, kMaxDim));
    c.hc = as_count(r.get_int({"hc_mult"}, 4, 0, kMaxCount));
    c.hc_sinkhorn_iters = as_count(r.get_int({"hc_sinkhorn_iters"}, 20, 1, kMaxCount));
    c.hc_eps = r.get_number({"hc_eps"}, 1e-6);
    c.norm_eps = r.get_number({"rms_norm_eps", "norm_eps"}, 1e-6);
    c.routed_scale = r.get_number({"routed_scaling_factor", "route_scale"}, ref ? 1.0 : 1.5);
    c.swiglu_limit = r.get_number({"swiglu_limit"}, ref ? 0.0 : 10.0);
    c.index_n_heads = as_count(r.get_int({"index_n_heads"}, 64, 1, kMaxCount));
    c.index_head_dim = as_count(r.get_int({"index_head_dim"}, 128, 1, kMaxCount));
    c.index_topk = as_count(r.get_int({"index_topk"}, 512, 1, kMaxDim));
    c.max_position_embeddings = r.get_int({"max_position_embeddings"}, 1048576, 1, kMaxDim);
    c.tie_word_embeddings = r.get_bool({"tie_word_embeddings"}, false);
    c.bos_token_id = parse_token_id(r, "bos_token_id", 0);
    c.eos_token_id = parse_token_id(r, "eos_token_id", 1);

    const std::string scoring = r.get_string({"scoring_func", "score_func"}, "sqrtsoftplus");
    if (scoring != "sqrtsoftplus")
        r.fail(r.has({"scoring_func"}) ? "scoring_func" : "score_func",
               "\"sqrtsoftplus\" (the only router cpfill implements)", show(json(scoring)));
    r.expect_value({"hidden_act"}, std::string("silu"), "SwiGLU experts");
    r.expect_value({"attention_bias"}, false, "V4 attention has no biases");
    r.expect_value({"mlp_bias"}, false, "shared-expert biases are not supported");

    // partial_rotary_factor, else legacy qk_rope_head_dim / head_dim, else 64/512; HF then takes
    // int(head_dim * factor) (a Python float product, truncated).
    double prf = 64.0 / 512.0;
    std::string k;
    if (const json* v = r.find({"partial_rotary_factor"}, &k))
        prf = r.as_number(*v, k);
    else if (const json* v2 = r.find({"qk_rope_head_dim", "rope_head_dim"}, &k))
        prf = static_cast<double>(r.as_int(*v2, k, 0, kMaxCount)) / c.head_dim;
    if (!(prf > 0 && prf <= 1))
        r.fail(k.empty() ? "partial_rotary_factor" : k,
               "a rotary part in (0, head_dim] (factor in (0, 1])", fmt::format("factor {}", prf));
    c.rope_dim = static_cast<int>(static_cast<double>(c.head_dim) * prf);

    parse_rope(r, ref, prf, c);
    parse_layer_types(r, c);
    parse_mlp_types(r, ref, c);
    return c;
}

}  // namespace

std::string_view attn_type_name(AttnType t) {
    switch (t) {
        case AttnType::Sliding:
            return "sliding_attention";
        case AttnType::CSA:
            return "compressed_sparse_attention";
        case AttnType::HCA:
            return "heavily_compressed_attention";
    }
    return "?";
}

std::string_view mlp_type_name(MlpType t) { return t == MlpType::Hash ? "hash_moe" : "moe"; }

int ModelConfig::ratio(int layer) const {
    switch (layer_types.at(static_cast<size_t>(layer))) {
        case AttnType::Sliding:
            return 0;
        case AttnType::CSA:
            return csa_ratio;
        case AttnType::HCA:
            return hca_ratio;
    }
    return 0;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
    json j;
    try {
        j = json::parse(json_text);
    } catch (const json::exception& e) {
        CPFILL_FAIL("{}: config is not valid JSON: {}", source, e.what());
    }
    CPFILL_CHECK(j.is_object(), "{}: config must be a JSON object, found {}", source, show(j));
    ModelConfig c = parse_fields(Reader(j, source));
    validate_model_config(c, source);
    return c;
}

ModelConfig load_model_config(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    CPFILL_CHECK(f.good(), "cannot open config {}", path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return parse_model_config(ss.str(), path);
}

void validate_model_config(const ModelConfig& c, const std::string& source) {
    auto check = [&](bool ok, std::string_view field, const std::string& expected,
                     const std::string& found) {
        if (!ok)
            CPFILL_FAIL("{}: config field \"{}\": expected {}, found {}", source, field, expected,
                        found);
    };
    auto positive = [&](int64_t v, std::string_view field) {
        check(v > 0, field, "a positive integer", std::to_string(v));
    };
    positive(c.vocab_size, "vocab_size");
    positive(c.d_model, "hidden_size");
    positive(c.n_layers, "num_hidden_layers");
    positive(c.n_heads, "num_attention_heads");
    positive(c.head_dim, "head_dim");
    positive(c.q_rank, "q_lora_rank");
    positive(c.o_groups, "o_groups");
    positive(c.o_rank, "o_lora_rank");
    positive(c.window, "sliding_window");
    positive(c.n_experts, "n_routed_experts");
    positive(c.top_k, "num_experts_per_tok");
    positive(c.moe_dim, "moe_intermediate_size");
    positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
    check(c.hc >= 1, "hc_mult", "at least 1 residual stream", std::to_string(c.hc));
    check(c.rope_dim >= 2 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim,
          "qk_rope_head_dim (head_dim * partial_rotary_factor)",
          fmt::format("an even number in [2, head_dim = {}]", c.head_dim),
          std::to_string(c.rope_dim));
    check(c.n_heads % c.o_groups == 0, "o_groups",
          fmt::format("a divisor of num_attention_heads = {}", c.n_heads),
          std::to_string(c.o_groups));
    check(c.top_k <= c.n_experts, "num_experts_per_tok",
          fmt::format("at most n_routed_experts = {}", c.n_experts), std::to_string(c.top_k));
    check(c.n_shared_experts == 1, "n_shared_experts", "1 (V4 has one shared expert)",
          std::to_string(c.n_shared_experts));
    check(c.norm_eps > 0, "rms_norm_eps", "a positive number", fmt::format("{}", c.norm_eps));
    check(c.hc_eps >= 0, "hc_eps", "a non-negative number", fmt::format("{}", c.hc_eps));
    check(c.routed_scale > 0, "routed_scaling_factor", "a positive number",
          fmt::format("{}", c.routed_scale));
    check(c.swiglu_limit >= 0, "swiglu_limit", "a non-negative number (0 = no clamp)",
          fmt::format("{}", c.swiglu_limit));
    check(c.csa_ratio >= 1 && c.hca_ratio >= 1 && c.csa_ratio != c.hca_ratio, "compress_rates",
          "two different positive rates", fmt::format("{} and {}", c.csa_ratio, c.hca_ratio));
    check(c.layer_types.size() == static_cast<size_t>(c.n_layers), "layer_types",
          fmt::format("{} entries (num_hidden_layers)", c.n_layers),
          fmt::format("{} entries", c.layer_types.size()));
    check(c.mlp_types.size() == static_cast<size_t>(c.n_layers), "mlp_layer_types",
          fmt::format("{} entries (num_hidden_layers)", c.n_layers),
          fmt::format("{} entries", c.mlp_types.size()));
    bool any_csa = false;
    for (AttnType t : c.layer_types) any_csa |= t == AttnType::CSA;
    if (any_csa) {
        positive(c.index_n_heads, "index_n_heads");
        positive(c.index_topk, "index_topk");
        check(c.index_head_dim >= c.rope_dim && c.index_head_dim % 2 == 0, "index_head_dim",
              fmt::format("an even number >= qk_rope_head_dim = {}", c.rope_dim),
              std::to_string(c.index_head_dim));
    }
    for (const auto& [name, p] : {std::pair{"rope_parameters.main", &c.rope_main},
                                  std::pair{"rope_parameters.compress", &c.rope_compress}}) {
        check(p->theta > 1, fmt::format("{}.rope_theta", name), "a number > 1",
              fmt::format("{}", p->theta));
        if (!p->yarn) continue;
        check(p->factor > 0, fmt::format("{}.factor", name), "a positive number",
              fmt::format("{}", p->factor));
        check(p->original_max_pos >= 1, fmt::format("{}.original_max_position_embeddings", name),
              "a positive integer", fmt::format("{}", p->original_max_pos));
        check(p->beta_fast > 0 && p->beta_slow > 0, fmt::format("{}.beta_fast/beta_slow", name),
              "positive numbers", fmt::format("{} / {}", p->beta_fast, p->beta_slow));
    }
}

}  // namespace cpfill
