// tokenizer.json -> TokenizerData: parses the JSON, checks every section against what the
// tokenizer implements (tokenizer.h lists it) and builds the tables. Every error names the file and
// the field path (e.g. "pre_tokenizer.pretokenizers[2].pattern.Regex"), what was expected and what
// was found.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_excerpt.h"
#include "io/tokenizer_data.h"

namespace cpfill::tokenizer {

namespace {

using json = nlohmann::json;

std::string show(const json& v) { return json_excerpt(v, 80); }

// Typed access to the fields of one JSON object, at `path` inside the file `source`.
class Obj {
  public:
    Obj(const json& v, const std::string& source, std::string path)
        : v_(v), source_(source), path_(std::move(path)) {
        if (!v.is_object()) fail("", fmt::format("expected an object, found {}", show(v)));
    }

    [[noreturn]] void fail(std::string_view key, const std::string& msg) const {
        CPFILL_FAIL("tokenizer.json '{}': {}: {}", source_, field(key), msg);
    }
    std::string field(std::string_view key) const {
        if (key.empty()) return path_.empty() ? "top level" : path_;
        return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
    }
    // The value under `key`; nullptr when absent or null.
    const json* find(const char* key) const {
        auto it = v_.find(key);
        return it == v_.end() || it->is_null() ? nullptr : &*it;
    }
    const json& at(const char* key) const {
        const json* v = find(key);
        if (!v) fail(key, "missing field");
        return *v;
    }
    Obj sub(const char* key) const { return Obj(at(key), source_, field(key)); }
    std::string str(const char* key) const {
        const json& v = at(key);
        if (!v.is_string()) fail(key, fmt::format("expected a string, found {}", show(v)));
        return v.get<std::string>();
    }
    bool flag(const char* key, bool fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        if (!v->is_boolean()) fail(key, fmt::format("expected true or false, found {}", show(*v)));
        return v->get<bool>();
    }
    int32_t id(const char* key) const {
        const json& v = at(key);
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            fail(key, fmt::format("expected a token id in [0, 2^31), found {}", show(v)));
        return static_cast<int32_t>(v.get<int64_t>());
    }
    const json& list(const char* key) const {
        const json& v = at(key);
        if (!v.is_array()) fail(key, fmt::format("expected a list, found {}", show(v)));
        return v;
    }
    // Fails unless the option is absent, null or equal to one of `allowed`.
    void only(const char* key, std::initializer_list<json> allowed, std::string_view why) const {
        const json* v = find(key);
        if (!v) return;
        for (const json& a : allowed)
            if (*v == a) return;
        fail(key, fmt::format("{} is not supported ({})", show(*v), why));
    }
    const json& value() const { return v_; }
    const std::string& source() const { return source_; }

  private:
    const json& v_;
    const std::string& source_;
    std::string path_;
};

std::string indexed(const std::string& path, size_t i) { return fmt::format("{}[{}]", path, i); }

// vocab and added_tokens -> the id tables; both feed token_to_id, the added tokens last (as
// transformers.js does, so they win when a spelling is in both).
void parse_tokens(const Obj& root, const Obj& model, TokenizerData& d) {
    const Obj vocab = model.sub("vocab");
    int64_t size = 0;
    for (const auto& [token, v] : vocab.value().items()) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            vocab.fail(token, fmt::format("expected a token id in [0, 2^31), found {}", show(v)));
        d.token_to_id.emplace(token, static_cast<int32_t>(v.get<int64_t>()));
        size = std::max<int64_t>(size, v.get<int64_t>() + 1);
    }
    const json& added = root.list("added_tokens");
    for (size_t i = 0; i < added.size(); ++i) {
        const Obj t(added[i], root.source(), indexed("added_tokens", i));
        AddedToken a{t.str("content"), t.id("id"), t.flag("lstrip", false),
                     t.flag("rstrip", false)};
        if (a.content.empty()) t.fail("content", "an added token cannot be empty");
        size = std::max<int64_t>(size, int64_t{a.id} + 1);
        d.any_strip = d.any_strip || a.lstrip || a.rstrip;
        d.added.push_back(std::move(a));
    }
    CPFILL_CHECK(size <= (int64_t{1} << 24),
                 "tokenizer.json '{}': vocabulary of {} ids is too large", d.source, size);
    d.id_token.assign(size, "");
    d.id_bytes.assign(size, "");
    d.id_state.assign(size, 0);
    for (const auto& [token, id] : d.token_to_id) {
        if (d.id_state[id] != 0)
            vocab.fail(token, fmt::format("id {} is also used by '{}'", id, d.id_token[id]));
        d.id_token[id] = token;
        d.id_state[id] = 1;
        // A non-byte-level spelling (DeepSeek's <｜begin▁of▁sentence｜> ...) decodes as itself.
        if (!from_byte_level(token, d.id_bytes[id])) d.id_bytes[id] = token;
    }
    for (size_t i = 0; i < d.added.size(); ++i) {
        const AddedToken& a = d.added[i];
        if (!d.added_by_content.emplace(a.content, static_cast<int32_t>(i)).second)
            root.fail(indexed("added_tokens", i), fmt::format("'{}' is listed twice", a.content));
        d.token_to_id[a.content] = a.id;
        d.id_token[a.id] = a.content;
        d.id_state[a.id] = 2;
        d.added_trie.insert(a.content, static_cast<int32_t>(i));
    }
}

int32_t vocab_id(const TokenizerData& d, const Obj& at, const std::string& key,
                 const std::string& token) {
    auto it = d.token_to_id.find(token);
    if (it == d.token_to_id.end())
        at.fail(key, fmt::format("token '{}' is not in the vocabulary", token));
    return it->second;
}

void parse_model(const Obj& model, TokenizerData& d) {
    const std::string type = model.str("type");
    if (type != "BPE")
        model.fail("type", fmt::format("model type '{}' is not supported (only BPE)", type));
    model.only("dropout", {0, 0.0}, "BPE dropout");
    model.only("byte_fallback", {false}, "byte fallback");
    model.only("continuing_subword_prefix", {""}, "subword prefixes");
    model.only("end_of_word_suffix", {""}, "end-of-word suffixes");
    d.ignore_merges = model.flag("ignore_merges", false);

    std::array<int32_t, 256> byte_ids{};
    for (uint32_t b = 0; b < 256; ++b) {
        const std::string ch = to_byte_level(std::string(1, static_cast<char>(b)));
        byte_ids[b] = vocab_id(d, model, "vocab", ch);
    }
    const json& merges = model.list("merges");
    std::vector<BpeModel::Merge> table;
    table.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& m = merges[i];
        const std::string key = indexed("merges", i);
        std::string left, right;
        if (m.is_string() && std::count(m.get_ref<const std::string&>().begin(),
                                        m.get_ref<const std::string&>().end(), ' ') == 1) {
            const std::string& s = m.get_ref<const std::string&>();
            left = s.substr(0, s.find(' '));
            right = s.substr(s.find(' ') + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            left = m[0].get<std::string>();
            right = m[1].get<std::string>();
        } else {
            model.fail(key,
                       fmt::format("expected \"left right\" or [left, right], found {}", show(m)));
        }
        table.push_back({vocab_id(d, model, key, left), vocab_id(d, model, key, right),
                         vocab_id(d, model, key, left + right)});
    }
    d.bpe = BpeModel(byte_ids, table);
}

void parse_normalizer(const Obj& root) {
    const json* n = root.find("normalizer");
    if (!n) return;
    const Obj norm(*n, root.source(), "normalizer");
    const std::string type = norm.str("type");
    if (type != "Sequence" || !norm.list("normalizers").empty())
        root.fail("normalizer",
                  fmt::format("{} is not supported (only none or an empty Sequence)", show(*n)));
}

// One pre-tokenizer (recursing into Sequence) -> d.splits; `byte_level` is set by ByteLevel.
void parse_pre_tokenizer(const Obj& p, TokenizerData& d, bool& byte_level) {
    const std::string type = p.str("type");
    if (type == "Sequence") {
        const json& steps = p.list("pretokenizers");
        for (size_t i = 0; i < steps.size(); ++i)
            parse_pre_tokenizer(Obj(steps[i], p.source(), p.field(indexed("pretokenizers", i))), d,
                                byte_level);
    } else if (type == "Split") {
        if (byte_level) p.fail("", "a Split after ByteLevel is not supported");
        const Obj pattern = p.sub("pattern");
        if (!pattern.find("Regex"))
            pattern.fail("", fmt::format("{} is not supported (only Regex patterns)",
                                         show(pattern.value())));
        const std::string regex = pattern.str("Regex");
        const auto split = find_split_pattern(regex);
        if (!split) {
            std::string known;
            for (const std::string& r : supported_split_regexes()) known += "\n  " + json(r).dump();
            pattern.fail("Regex", fmt::format("unsupported regex {}; the tokenizer implements only "
                                              "these (hand-written, see tokenizer_split.cpp):{}",
                                              json(regex).dump(), known));
        }
        if (p.str("behavior") != "Isolated")
            p.fail("behavior",
                   fmt::format("'{}' is not supported (only Isolated)", p.str("behavior")));
        p.only("invert", {false}, "inverted splits");
        d.splits.push_back(*split);
    } else if (type == "ByteLevel") {
        if (byte_level) p.fail("", "ByteLevel appears twice");
        p.only("add_prefix_space", {false}, "prefix spaces");
        p.only("use_regex", {false}, "the GPT-2 split regex");
        byte_level = true;
    } else {
        p.fail("type", fmt::format("pre-tokenizer type '{}' is not supported (Sequence, Split, "
                                   "ByteLevel)",
                                   type));
    }
}

// Post-processor -> the special ids placed around the sequence (with add_special_tokens).
void parse_post_processor(const Obj& p, TokenizerData& d) {
    const std::string type = p.str("type");
    if (type == "ByteLevel") return;  // changes offsets only
    if (type == "Sequence") {
        const json& steps = p.list("processors");
        for (size_t i = 0; i < steps.size(); ++i)
            parse_post_processor(Obj(steps[i], p.source(), p.field(indexed("processors", i))), d);
        return;
    }
    if (type != "TemplateProcessing")
        p.fail("type", fmt::format("post-processor type '{}' is not supported (ByteLevel, "
                                   "TemplateProcessing, Sequence)",
                                   type));
    const json& single = p.list("single");
    std::vector<int32_t> prefix, suffix;
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
        const Obj item(single[i], p.source(), p.field(indexed("single", i)));
        if (item.find("SpecialToken")) {
            const Obj special = item.sub("SpecialToken");
            const int32_t id = vocab_id(d, special, "id", special.str("id"));
            (seen_sequence ? suffix : prefix).push_back(id);
        } else if (item.find("Sequence")) {
            const Obj seq = item.sub("Sequence");
            if (seq.str("id") != "A" || seen_sequence)
                seq.fail("id", "expected the sequence A exactly once in a single-text template");
            seen_sequence = true;
        } else {
            item.fail("", "expected SpecialToken or Sequence");
        }
    }
    if (!seen_sequence) p.fail("single", "the template lacks the sequence A");
    // A later template wraps what the earlier ones produced.
    d.special_prefix.insert(d.special_prefix.begin(), prefix.begin(), prefix.end());
    d.special_suffix.insert(d.special_suffix.end(), suffix.begin(), suffix.end());
}

}  // namespace

TokenizerData parse_tokenizer_json(std::string_view json_text, const std::string& source) {
    json doc;
    try {
        doc = json::parse(json_text);
    } catch (const json::exception& e) {
        CPFILL_FAIL("tokenizer.json '{}': malformed JSON: {}", source, e.what());
    }
    TokenizerData d;
    d.source = source;
    const Obj root(doc, d.source, "");
    const Obj model = root.sub("model");
    parse_tokens(root, model, d);
    parse_model(model, d);
    parse_normalizer(root);

    const json* pre = root.find("pre_tokenizer");
    if (!pre) root.fail("pre_tokenizer", "missing (a byte-level BPE needs a ByteLevel step)");
    bool byte_level = false;
    parse_pre_tokenizer(Obj(*pre, d.source, "pre_tokenizer"), d, byte_level);
    if (!byte_level) root.fail("pre_tokenizer", "expected a ByteLevel step (the last one)");

    if (const json* post = root.find("post_processor"))
        parse_post_processor(Obj(*post, d.source, "post_processor"), d);

    const Obj decoder = root.sub("decoder");
    if (decoder.str("type") != "ByteLevel")
        decoder.fail("type", fmt::format("decoder type '{}' is not supported (only ByteLevel)",
                                         decoder.str("type")));
    return d;
}

}  // namespace cpfill::tokenizer
