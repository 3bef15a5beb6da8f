// POST /v1/completions' body: the OpenAI completions fields a prefill server can honour
// (docs/serve.md "OpenAI subset"). max_tokens 0 scores the prompt, 1 gives the argmax next token;
// anything that needs decoding (more tokens, streaming, several choices) is a 400 that says why.
// Sampling fields (temperature, top_p, seed, …) are accepted and ignored: the one token is greedy.
#include "serve/http_error.h"
#include "serve/request_parse.h"

namespace cpfill::serve {

CompletionRequest parse_completion_request(std::string_view body, const PromptLimits& limits,
                                           const Tokenize& tokenize) {
    const nlohmann::json j = parse_json_object(body);
    if (!j.contains("prompt")) bad_request("the field \"prompt\" is missing: expected the prompt");
    CompletionRequest r;
    r.prompts = parse_prompts(j["prompt"], "prompt", true, true, limits, tokenize);
    if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
        const nlohmann::json& v = j["max_tokens"];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1)
            bad_request(
                "max_tokens: expected 0 (score the prompt) or 1 (the next token), found {}: this "
                "server only prefills, it does not decode further tokens",
                v.dump());
        r.max_tokens = v.get<int>();
    }
    if (j.contains("stream") && parse_bool_field(j["stream"], "stream"))
        bad_request(
            "stream: true is not supported: a prefill server returns at most one token, so there "
            "is nothing to stream; send stream: false");
    for (const char* f : {"n", "best_of"})
        if (j.contains(f) && !j[f].is_null()) parse_int_field(j[f], f, 1, 1);
    if (j.contains("logprobs") && !j["logprobs"].is_null())
        r.logprobs = parse_int_field(j["logprobs"], "logprobs", 0, kMaxTopLogprobs);
    if (j.contains("echo")) r.echo = parse_bool_field(j["echo"], "echo");
    if (j.contains("model")) {
        if (!j["model"].is_string())
            bad_request("model: expected a string, found {}", j["model"].dump());
        r.model = j["model"].get<std::string>();
    }
    if (r.max_tokens == 0 && !r.echo)
        bad_request(
            "max_tokens 0 without echo returns nothing: add \"echo\": true (with \"logprobs\" to "
            "score the prompt) or ask for max_tokens 1");
    return r;
}

}  // namespace cpfill::serve
