// The JSON bodies of POST /v1/prefill and POST /v1/completions, parsed and validated without any
// socket (docs/serve.md "Endpoints"): every field's type and range is checked before a request
// reaches the queue, and a bad one is an HttpError (400, or 413 over a length limit) whose message
// names the field, what was expected and what was found.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace cpfill::serve {

// Text → token ids as `cpfill run --prompt` makes them (BOS first). Empty: the server has no
// tokenizer, and text prompts are refused.
using Tokenize = std::function<std::vector<int32_t>(const std::string&)>;

inline constexpr int kMaxTopLogprobs = 20;

struct PromptLimits {
    int64_t vocab_size = 0;
    int64_t max_prompt_tokens = 0;  // per prompt; 0: no limit
    size_t max_prompts = 256;       // prompts in one HTTP request
};

struct PrefillRequest {
    std::vector<std::vector<int32_t>> prompts;
    int top_logprobs = 0;  // k most likely next tokens per prompt (0: none)
    std::string kv_out;    // folder to write the KV state into, as `run --kv-out` (empty: none)
    bool return_kv = false;
};

struct CompletionRequest {
    std::vector<std::vector<int32_t>> prompts;
    int max_tokens = 1;  // 0 (score the prompt) or 1 (the next token)
    int logprobs = -1;   // -1: no logprobs object; else top alternatives per position (0 … 20)
    bool echo = false;
    std::string model;
    // Logits of every position are needed: echo with logprobs scores each prompt token.
    bool all_logits() const { return echo && logprobs >= 0; }
};

// Parses a body; throws HttpError. Tokenize may be empty (no tokenizer).
PrefillRequest parse_prefill_request(std::string_view body, const PromptLimits& limits,
                                     const Tokenize& tokenize);
CompletionRequest parse_completion_request(std::string_view body, const PromptLimits& limits,
                                           const Tokenize& tokenize);

// Shared by both parsers (prompt_input.cpp).
nlohmann::json parse_json_object(std::string_view body);
// One field's prompts: a string, a list of ids, or a list of either (`text`/`ids` say which forms
// the field takes). Checks emptiness, the ids against the vocabulary and the limits.
std::vector<std::vector<int32_t>> parse_prompts(const nlohmann::json& v, const std::string& field,
                                                bool text, bool ids, const PromptLimits& limits,
                                                const Tokenize& tokenize);
// The integer in field `name` within [lo, hi].
int parse_int_field(const nlohmann::json& v, const std::string& name, int lo, int hi);
bool parse_bool_field(const nlohmann::json& v, const std::string& name);

}  // namespace cpfill::serve
