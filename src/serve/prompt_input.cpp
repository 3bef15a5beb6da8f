// Prompts in a request body: token ids or text, one or several, checked against the vocabulary and
// the length limits (request_parse.h).
#include <fmt/format.h>

#include <limits>

#include "serve/http_error.h"
#include "serve/request_parse.h"

namespace cpfill::serve {

namespace {

using nlohmann::json;

// "a string", "an array", … for messages.
std::string found(const json& v) {
    if (v.is_number_float()) return fmt::format("the number {}", v.dump());
    const std::string t = v.type_name();
    const bool vowel = t[0] == 'a' || t[0] == 'o';
    return fmt::format("{} {}", vowel ? "an" : "a", t == "array" ? "list" : t);
}

bool is_id_list(const json& v) { return v.is_array() && !v.empty() && v.front().is_number(); }

std::vector<int32_t> parse_ids(const json& v, const std::string& where, const PromptLimits& lim) {
    std::vector<int32_t> ids;
    ids.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const json& x = v[i];
        if (!x.is_number_integer())
            bad_request("{}[{}]: expected an integer token id, found {}", where, i, found(x));
        // Compared as signed 64-bit: an unsigned value above INT64_MAX reads as out of range too.
        const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX)
                               ? std::numeric_limits<int64_t>::max()
                               : x.get<int64_t>();
        if (id < 0 || id >= lim.vocab_size)
            bad_request("{}[{}]: token id {} is outside the vocabulary: expected 0 <= id < {}",
                        where, i, x.dump(), lim.vocab_size);
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}

std::vector<int32_t> parse_text(const json& v, const std::string& where, const PromptLimits& lim,
                                const Tokenize& tokenize) {
    const std::string& text = v.get_ref<const std::string&>();
    if (text.empty()) bad_request("{}: the prompt is empty, expected some text", where);
    if (!tokenize)
        bad_request(
            "{}: text needs a tokenizer and this server has none (the model's vocabulary does "
            "not hold DeepSeek's): send token ids instead",
            where);
    std::vector<int32_t> ids;
    try {
        ids = tokenize(text);
    } catch (const std::exception& e) {
        bad_request("{}: cannot tokenise the text: {}", where, e.what());
    }
    for (int32_t id : ids)
        if (id >= lim.vocab_size)
            bad_request("{}: the tokenizer gave id {}, outside the model's vocabulary of {}", where,
                        id, lim.vocab_size);
    return ids;
}

}  // namespace

json parse_json_object(std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
        bad_request("the body is not valid JSON: expected one JSON object ({} bytes received)",
                    body.size());
    if (!j.is_object()) bad_request("the body is {}: expected a JSON object", found(j));
    return j;
}

std::vector<std::vector<int32_t>> parse_prompts(const json& v, const std::string& field, bool text,
                                                bool ids, const PromptLimits& lim,
                                                const Tokenize& tokenize) {
    const std::string forms = text && ids ? "a string, a list of token ids, or a list of either"
                              : text      ? "a string or a list of strings"
                                          : "a list of token ids or a list of such lists";
    std::vector<std::vector<int32_t>> out;
    if (text && v.is_string()) {
        out.push_back(parse_text(v, field, lim, tokenize));
    } else if (ids && is_id_list(v)) {
        out.push_back(parse_ids(v, field, lim));
    } else if (v.is_array() && !v.empty()) {
        if (v.size() > lim.max_prompts)
            bad_request("{}: {} prompts in one request, expected at most {}", field, v.size(),
                        lim.max_prompts);
        for (size_t i = 0; i < v.size(); ++i) {
            const std::string where = fmt::format("{}[{}]", field, i);
            const json& p = v[i];
            if (text && p.is_string()) {
                out.push_back(parse_text(p, where, lim, tokenize));
            } else if (ids && p.is_array()) {
                if (p.empty())
                    bad_request("{}: the prompt is empty, expected at least one token", where);
                out.push_back(parse_ids(p, where, lim));
            } else {
                bad_request("{}: expected {}, found {}", where,
                            text && ids ? "a string or a list of token ids"
                            : text      ? "a string"
                                        : "a list of token ids",
                            found(p));
            }
        }
    } else if (v.is_array()) {
        bad_request("{}: the list is empty, expected {}", field, forms);
    } else {
        bad_request("{}: expected {}, found {}", field, forms, found(v));
    }
    for (size_t i = 0; i < out.size(); ++i)
        if (lim.max_prompt_tokens > 0 &&
            static_cast<int64_t>(out[i].size()) > lim.max_prompt_tokens)
            throw HttpError(413, "invalid_request_error",
                            fmt::format("{}: prompt {} has {} tokens, more than the server's "
                                        "limit of {} (--max-prompt-tokens)",
                                        field, i, out[i].size(), lim.max_prompt_tokens));
    return out;
}

int parse_int_field(const json& v, const std::string& name, int lo, int hi) {
    if (!v.is_number_integer())
        bad_request("{}: expected an integer from {} to {}, found {}", name, lo, hi, found(v));
    const bool big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
    const int64_t x = big ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
    if (x < lo || x > hi)
        bad_request("{}: expected an integer from {} to {}, found {}", name, lo, hi, v.dump());
    return static_cast<int>(x);
}

bool parse_bool_field(const json& v, const std::string& name) {
    if (!v.is_boolean()) bad_request("{}: expected true or false, found {}", name, found(v));
    return v.get<bool>();
}

}  // namespace cpfill::serve
