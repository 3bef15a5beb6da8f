// POST /v1/prefill's body (docs/serve.md): {"input_ids": …} or {"prompt": …}, and "top_logprobs",
// "kv_out", "return_kv". Unknown fields are refused: a misspelt option would otherwise be ignored.
#include "serve/http_error.h"
#include "serve/request_parse.h"

namespace cpfill::serve {

PrefillRequest parse_prefill_request(std::string_view body, const PromptLimits& limits,
                                     const Tokenize& tokenize) {
    const nlohmann::json j = parse_json_object(body);
    for (const auto& [key, value] : j.items())
        if (key != "input_ids" && key != "prompt" && key != "top_logprobs" && key != "kv_out" &&
            key != "return_kv")
            bad_request(
                "unknown field \"{}\": expected input_ids or prompt, and optionally top_logprobs, "
                "kv_out, return_kv",
                key);
    const bool ids = j.contains("input_ids"), text = j.contains("prompt");
    if (ids == text)
        bad_request(
            "expected exactly one of \"input_ids\" (token ids) or \"prompt\" (text), found {}",
            ids ? "both" : "neither");
    PrefillRequest r;
    r.prompts = ids ? parse_prompts(j["input_ids"], "input_ids", false, true, limits, tokenize)
                    : parse_prompts(j["prompt"], "prompt", true, false, limits, tokenize);
    if (j.contains("top_logprobs"))
        r.top_logprobs = parse_int_field(j["top_logprobs"], "top_logprobs", 0, kMaxTopLogprobs);
    if (j.contains("kv_out")) {
        const nlohmann::json& v = j["kv_out"];
        if (!v.is_string() || v.get_ref<const std::string&>().empty())
            bad_request("kv_out: expected a folder path (a non-empty string), found {}", v.dump());
        r.kv_out = v.get<std::string>();
    }
    if (j.contains("return_kv")) r.return_kv = parse_bool_field(j["return_kv"], "return_kv");
    return r;
}

}  // namespace cpfill::serve
