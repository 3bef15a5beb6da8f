// The JSON bodies of successful /v1/prefill and /v1/completions answers, from a job's logits
// (docs/serve.md shows both shapes). No sockets: the tests call these directly too.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/request_parse.h"
#include "serve/scheduler.h"

namespace cpfill::serve {

// A token's text; empty function: the server has no tokenizer.
using Detokenize = std::function<std::string(int32_t)>;

struct Timings {
    double queue_ms = 0, prefill_ms = 0, total_ms = 0;
};

// {"requests": [{"first_token", "first_token_text"?, "tokens", "top_logprobs"?, "kv"?}, …],
//  "timings": {…}}. `kv_files` (return_kv): each prompt's KV state file, base64 in "kv".
nlohmann::json prefill_response(const PrefillRequest& req, const JobResult& res,
                                const Detokenize& detok, const Timings& t,
                                const std::vector<std::string>& kv_files);

// The OpenAI completions object: id, object, created, model, choices[] (text, index, logprobs,
// finish_reason), usage.
nlohmann::json completion_response(const CompletionRequest& req, const JobResult& res,
                                   const Detokenize& detok, const std::string& model,
                                   const std::string& id, int64_t created);

}  // namespace cpfill::serve
