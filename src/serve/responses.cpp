// Building the answers: first tokens, top log-probabilities, echo scoring.
#include "serve/responses.h"

#include <cmath>

#include "serve/http_error.h"
#include "serve/kv_bytes.h"
#include "serve/logprobs.h"

namespace cpfill::serve {

namespace {

using nlohmann::json;

// Row `pos` of a prompt's logits (f32 [vocab] holds the last position only).
const float* logits_row(const Tensor& l, int64_t pos) {
    return l.ndim() == 2 ? l.f32() + pos * l.dim(1) : l.f32();
}

double checked_lse(const float* row, int64_t vocab, size_t prompt) {
    const double lse = log_sum_exp(row, vocab);
    if (!std::isfinite(lse))
        throw HttpError(500, "server_error",
                        fmt::format("prompt {}: the logits are not finite (the activations "
                                    "overflowed), expected finite logits: no token is reported",
                                    prompt));
    return lse;
}

std::string token_text(const Detokenize& detok, int32_t id) {
    return detok ? detok(id) : std::to_string(id);
}

// One position of the OpenAI logprobs object.
struct Step {
    int32_t id;
    std::optional<double> logprob;  // none for the first prompt token (nothing precedes it)
    json top;                       // {token: logprob} or null
};

Step scored_step(const float* row, int64_t vocab, int32_t id, int k, double lse,
                 const Detokenize& detok) {
    Step s{id, double(row[id]) - lse, json::object()};
    for (const auto& [t, lp] : top_logprobs(row, vocab, k, lse)) s.top[token_text(detok, t)] = lp;
    return s;
}

json choice(const CompletionRequest& req, const Tensor& logits, const std::vector<int32_t>& prompt,
            int32_t next, size_t index, const Detokenize& detok, int64_t& completion_tokens) {
    const int64_t V = logits.ndim() == 2 ? logits.dim(1) : logits.dim(0);
    const int64_t len = static_cast<int64_t>(prompt.size());
    std::vector<Step> steps;
    if (req.echo) {
        for (int64_t p = 0; p < len; ++p) {
            if (p == 0 || !req.all_logits()) {
                steps.push_back({prompt[p], std::nullopt, json(nullptr)});
                continue;
            }
            const float* row = logits_row(logits, p - 1);
            steps.push_back(
                scored_step(row, V, prompt[p], req.logprobs, checked_lse(row, V, index), detok));
        }
    }
    if (req.max_tokens == 1) {
        const float* row = logits_row(logits, len - 1);
        steps.push_back(scored_step(row, V, next, std::max(req.logprobs, 0),
                                    checked_lse(row, V, index), detok));
        ++completion_tokens;
    }
    json c;
    std::string text;
    json lp = {{"tokens", json::array()},
               {"token_logprobs", json::array()},
               {"top_logprobs", json::array()},
               {"text_offset", json::array()},
               {"token_ids", json::array()}};
    for (const Step& s : steps) {
        const std::string t = token_text(detok, s.id);
        lp["text_offset"].push_back(text.size());
        text += detok ? t : std::string();
        lp["tokens"].push_back(t);
        lp["token_ids"].push_back(s.id);
        lp["token_logprobs"].push_back(s.logprob ? json(*s.logprob) : json(nullptr));
        lp["top_logprobs"].push_back(s.top);
    }
    c["text"] = text;
    c["index"] = index;
    c["logprobs"] = req.logprobs >= 0 ? lp : json(nullptr);
    c["finish_reason"] = "length";
    return c;
}

}  // namespace

json prefill_response(const PrefillRequest& req, const JobResult& res, const Detokenize& detok,
                      const Timings& t, const std::vector<std::string>& kv_files) {
    json out;
    out["requests"] = json::array();
    for (size_t i = 0; i < req.prompts.size(); ++i) {
        const Tensor& l = res.logits[i];
        const int64_t V = l.ndim() == 2 ? l.dim(1) : l.dim(0);
        const float* row = logits_row(l, static_cast<int64_t>(req.prompts[i].size()) - 1);
        const double lse = checked_lse(row, V, i);
        json r = {{"first_token", res.first_tokens[i]}, {"tokens", req.prompts[i].size()}};
        if (detok) r["first_token_text"] = detok(res.first_tokens[i]);
        if (req.top_logprobs > 0) {
            r["top_logprobs"] = json::array();
            for (const auto& [id, lp] : top_logprobs(row, V, req.top_logprobs, lse))
                r["top_logprobs"].push_back({id, lp});
        }
        if (i < kv_files.size()) r["kv"] = base64_file(kv_files[i]);
        out["requests"].push_back(r);
    }
    out["timings"] = {
        {"queue_ms", t.queue_ms}, {"prefill_ms", t.prefill_ms}, {"total_ms", t.total_ms}};
    if (!req.kv_out.empty()) out["kv_out"] = req.kv_out;
    return out;
}

json completion_response(const CompletionRequest& req, const JobResult& res,
                         const Detokenize& detok, const std::string& model, const std::string& id,
                         int64_t created) {
    json out = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
    out["choices"] = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < req.prompts.size(); ++i) {
        prompt_tokens += static_cast<int64_t>(req.prompts[i].size());
        out["choices"].push_back(choice(req, res.logits[i], req.prompts[i], res.first_tokens[i], i,
                                        detok, completion_tokens));
    }
    out["usage"] = {{"prompt_tokens", prompt_tokens},
                    {"completion_tokens", completion_tokens},
                    {"total_tokens", prompt_tokens + completion_tokens}};
    return out;
}

}  // namespace cpfill::serve
