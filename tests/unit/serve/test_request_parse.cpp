// The request bodies of /v1/prefill and /v1/completions: every accepted form, and every kind of
// bad request with its status and a message naming the field, what was expected and what was
// found (no sockets; test_server covers the same over HTTP).
#include <gtest/gtest.h>

#include "serve/http_error.h"
#include "serve/request_parse.h"

namespace cpfill::serve {
namespace {

const PromptLimits kLimits{/*vocab_size=*/100, /*max_prompt_tokens=*/8, /*max_prompts=*/4};

// A stand-in tokenizer: BOS 1, then one id per character (its code mod 90, plus 10).
std::vector<int32_t> fake_tokenize(const std::string& text) {
    std::vector<int32_t> ids{1};
    for (char c : text) ids.push_back(10 + static_cast<unsigned char>(c) % 90);
    return ids;
}

// Expects parse(body) to throw an HttpError with `status` whose message holds every part.
template <typename Parse>
void expect_refused(Parse parse, const std::string& body, int status,
                    const std::vector<std::string>& parts) {
    try {
        parse(body);
        ADD_FAILURE() << "accepted: " << body;
    } catch (const HttpError& e) {
        EXPECT_EQ(e.status(), status) << body << ": " << e.what();
        for (const auto& p : parts)
            EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
                << body << ": '" << e.what() << "' lacks '" << p << "'";
    }
}

PrefillRequest prefill(const std::string& body) {
    return parse_prefill_request(body, kLimits, fake_tokenize);
}
CompletionRequest completion(const std::string& body) {
    return parse_completion_request(body, kLimits, fake_tokenize);
}

TEST(PrefillRequest, AcceptsIdsFlatOrNestedAndText) {
    EXPECT_EQ(prefill(R"({"input_ids": [3, 4, 5]})").prompts,
              (std::vector<std::vector<int32_t>>{{3, 4, 5}}));
    EXPECT_EQ(prefill(R"({"input_ids": [[3], [4, 99]]})").prompts,
              (std::vector<std::vector<int32_t>>{{3}, {4, 99}}));
    EXPECT_EQ(prefill(R"({"prompt": "ab"})").prompts,
              (std::vector<std::vector<int32_t>>{{1, 10 + 'a' % 90, 10 + 'b' % 90}}));
    const PrefillRequest r = prefill(
        R"({"prompt": ["a", "b"], "top_logprobs": 5, "kv_out": "/tmp/x", "return_kv": true})");
    EXPECT_EQ(r.prompts.size(), 2u);
    EXPECT_EQ(r.top_logprobs, 5);
    EXPECT_EQ(r.kv_out, "/tmp/x");
    EXPECT_TRUE(r.return_kv);
}

TEST(PrefillRequest, RefusesBadBodies) {
    expect_refused(prefill, "{\"input_ids\": [1, 2", 400, {"not valid JSON"});
    expect_refused(prefill, "[1, 2]", 400, {"expected a JSON object", "list"});
    expect_refused(prefill, "{}", 400, {"exactly one of", "neither"});
    expect_refused(prefill, R"({"input_ids": [1], "prompt": "a"})", 400, {"both"});
    expect_refused(prefill, R"({"input_ids": "1 2 3"})", 400,
                   {"input_ids", "list of token ids", "found a string"});
    expect_refused(prefill, R"({"input_ids": []})", 400, {"input_ids", "empty"});
    expect_refused(prefill, R"({"input_ids": [[1], []]})", 400, {"input_ids[1]", "empty"});
    expect_refused(prefill, R"({"input_ids": [1, 2.5]})", 400,
                   {"input_ids[1]", "integer token id", "2.5"});
    expect_refused(prefill, R"({"input_ids": [1, "2"]})", 400, {"input_ids[1]", "string"});
    expect_refused(prefill, R"({"input_ids": [[1, 100]]})", 400,
                   {"input_ids[0][1]", "token id 100", "0 <= id < 100"});
    expect_refused(prefill, R"({"input_ids": [-1]})", 400, {"token id -1"});
    expect_refused(prefill, R"({"input_ids": [18446744073709551615]})", 400,
                   {"token id 18446744073709551615"});
    expect_refused(prefill, R"({"prompt": ""})", 400, {"prompt", "empty"});
    expect_refused(prefill, R"({"prompt": [1, 2]})", 400, {"prompt", "string"});
    expect_refused(prefill, R"({"input_ids": [1], "top_logprobs": 21})", 400,
                   {"top_logprobs", "0 to 20", "21"});
    expect_refused(prefill, R"({"input_ids": [1], "top_logprobs": "3"})", 400,
                   {"top_logprobs", "string"});
    expect_refused(prefill, R"({"input_ids": [1], "return_kv": 1})", 400,
                   {"return_kv", "true or false"});
    expect_refused(prefill, R"({"input_ids": [1], "kv_out": ""})", 400, {"kv_out"});
    expect_refused(prefill, R"({"input_ids": [1], "top_logprob": 3})", 400,
                   {"unknown field \"top_logprob\""});
    expect_refused(prefill, R"({"input_ids": [[1], [2], [3], [4], [5]]})", 400,
                   {"5 prompts", "at most 4"});
}

TEST(PrefillRequest, RefusesPromptsOverTheLimitWith413) {
    expect_refused(prefill, R"({"input_ids": [[1], [1, 2, 3, 4, 5, 6, 7, 8, 9]]})", 413,
                   {"prompt 1 has 9 tokens", "limit of 8", "--max-prompt-tokens"});
    expect_refused(prefill, R"({"prompt": "12345678"})", 413, {"9 tokens"});  // BOS counts
}

TEST(PrefillRequest, TextWithoutATokenizerIsRefused) {
    expect_refused([](const std::string& b) { return parse_prefill_request(b, kLimits, {}); },
                   R"({"prompt": "hello"})", 400, {"needs a tokenizer", "token ids"});
}

TEST(CompletionRequest, AcceptsTheOpenAiSubset) {
    const CompletionRequest a = completion(R"({"prompt": "hi", "model": "m"})");
    EXPECT_EQ(a.max_tokens, 1);  // absent: one token (the OpenAI default of 16 is not served)
    EXPECT_EQ(a.logprobs, -1);
    EXPECT_FALSE(a.all_logits());
    const CompletionRequest b = completion(
        R"({"prompt": [[5, 6], "x"], "max_tokens": 0, "echo": true, "logprobs": 2,
            "temperature": 0, "n": 1, "stream": false})");
    EXPECT_EQ(b.prompts, (std::vector<std::vector<int32_t>>{{5, 6}, {1, 10 + 'x' % 90}}));
    EXPECT_EQ(b.max_tokens, 0);
    EXPECT_TRUE(b.all_logits());
    EXPECT_EQ(completion(R"({"prompt": [7, 8], "logprobs": null})").prompts.size(), 1u);
}

TEST(CompletionRequest, RefusesWhatAPrefillServerCannotDo) {
    expect_refused(completion, R"({"prompt": "a", "max_tokens": 16})", 400,
                   {"max_tokens", "0 (score the prompt) or 1", "16", "does not decode"});
    expect_refused(completion, R"({"prompt": "a", "stream": true})", 400,
                   {"stream", "nothing to stream"});
    expect_refused(completion, R"({"prompt": "a", "n": 2})", 400, {"n:", "2"});
    expect_refused(completion, R"({"prompt": "a", "max_tokens": 0})", 400,
                   {"without echo", "echo"});
    expect_refused(completion, R"({"max_tokens": 1})", 400, {"\"prompt\" is missing"});
    expect_refused(completion, R"({"prompt": {"text": "a"}})", 400, {"prompt", "found an object"});
    expect_refused(completion, R"({"prompt": [5, 6, 1000]})", 400, {"prompt[2]", "token id 1000"});
    expect_refused(completion, R"({"prompt": "a", "logprobs": -1})", 400, {"logprobs", "-1"});
    expect_refused(completion, R"({"prompt": "a", "echo": "yes"})", 400, {"echo", "string"});
}

}  // namespace
}  // namespace cpfill::serve
