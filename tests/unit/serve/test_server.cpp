// The server over HTTP on the tiny model: concurrent clients get PrefillEngine::run's results
// for their prompts alone; top_logprobs and echo scoring equal the log-softmax of the engine's
// logits; bad requests, a full queue, a failing batch and a gone client are answered without
// disturbing anything else; /health and /metrics say what happened.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

#include "prometheus_parse.h"
#include "server_fixture.h"

namespace cpfill::serve {
namespace {

using nlohmann::json;
using test::eventually;
using test::TestServer;
using test::TinyModel;

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int64_t vocab, int len) {
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab) - 1);
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& x : p) x = id(rng);
    return p;
}

// The reference: the prompt alone through the second engine.
RunResult alone(const std::vector<int32_t>& prompt, bool all_logits = false) {
    RunOptions ro;
    ro.all_logits = all_logits;
    return TinyModel::get().reference->run({prompt}, ro);
}

// Expects a served prefill answer for `prompt` (with top_logprobs k) to match the engine's.
void expect_matches_engine(const json& answer, const std::vector<int32_t>& prompt, int k,
                           const std::string& what) {
    const RunResult ref = alone(prompt);
    const int64_t V = TinyModel::get().cfg.vocab_size;
    const float* row = ref.out.logits[0].f32();
    ASSERT_TRUE(answer.is_object()) << what;
    EXPECT_EQ(answer["tokens"], prompt.size()) << what;
    if (test::top_gap(row, V) > 1e-3) {
        EXPECT_EQ(answer["first_token"], ref.first_tokens[0]) << what;
    }
    const json& top = answer["top_logprobs"];
    ASSERT_EQ(top.size(), size_t(k)) << what;
    for (int i = 0; i < k; ++i) {
        const int32_t id = top[i][0];
        const double lp = top[i][1];
        // Batched with other prompts vs alone: the same math in another summation order.
        EXPECT_NEAR(lp, test::reference_logprob(row, V, id), 1e-4) << what << " rank " << i;
        if (i > 0) {
            EXPECT_GE(double(top[i - 1][1]), lp) << what;
        }
    }
    // The most likely token is the engine's top one (its log-probability is the row's largest).
    double best = -INFINITY;
    for (int64_t t = 0; t < V; ++t)
        best = std::max(best, test::reference_logprob(row, V, int32_t(t)));
    EXPECT_NEAR(double(top[0][1]), best, 1e-4) << what;
}

TEST(Server, EightConcurrentClientsGetTheEngineResults) {
    test::ServerSetup s;
    s.hold_batches = true;  // the first batch waits until all eight have queued behind it
    TestServer srv(s);
    std::mt19937_64 rng(2024);
    std::vector<std::vector<int32_t>> prompts;
    for (int c = 0; c < 8; ++c) prompts.push_back(random_prompt(rng, 512, 3 + 7 * c));
    std::vector<json> answers(8);
    std::vector<int> status(8, 0);
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
        clients.emplace_back([&, c] {
            json body = {{"input_ids", prompts[c]}, {"top_logprobs", 5}};
            auto [st, j] = srv.post("/v1/prefill", body.dump());
            status[c] = st;
            if (st == 200) answers[c] = j["requests"][0];
        });
        if (c == 0) {
            EXPECT_TRUE(eventually([&] {
                return srv.server().scheduler() && srv.server().scheduler()->batch_held();
            }));
        }
    }
    EXPECT_TRUE(eventually([&] { return srv.server().scheduler()->queue_length() == 7; }));
    srv.server().scheduler()->release_batch();
    srv.server().scheduler()->release_batch();  // the other seven, as one batch
    for (auto& t : clients) t.join();
    for (int c = 0; c < 8; ++c) {
        ASSERT_EQ(status[c], 200) << "client " << c;
        expect_matches_engine(answers[c], prompts[c], 5, "client " + std::to_string(c));
    }
    const auto m = test::parse_prometheus(srv.get("/metrics").second);
    EXPECT_EQ(m.get("cpfill_batches_total"), 2);
    EXPECT_EQ(m.get("cpfill_prompt_tokens_total"), 3 * 8 + 7 * 28);
}

TEST(Server, EchoScoresEveryPromptToken) {
    TestServer srv;
    std::mt19937_64 rng(99);
    const std::vector<int32_t> prompt = random_prompt(rng, 512, 17);
    const json body = {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 3}};
    auto [st, j] = srv.post("/v1/completions", body.dump());
    ASSERT_EQ(st, 200) << j.dump();
    const RunResult ref = alone(prompt, /*all_logits=*/true);
    const int64_t V = TinyModel::get().cfg.vocab_size;
    const json& lp = j["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), prompt.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing precedes the first token
    for (size_t p = 1; p < prompt.size(); ++p) {
        const float* row = ref.out.logits[0].f32() + (p - 1) * V;
        EXPECT_NEAR(double(lp["token_logprobs"][p]), test::reference_logprob(row, V, prompt[p]),
                    1e-4)
            << "position " << p;
        EXPECT_EQ(lp["token_ids"][p], prompt[p]);
        ASSERT_EQ(lp["top_logprobs"][p].size(), 3u);
        for (const auto& [tok, v] : lp["top_logprobs"][p].items())
            EXPECT_NEAR(double(v), test::reference_logprob(row, V, std::stoi(tok)), 1e-4)
                << "position " << p << " token " << tok;
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["completion_tokens"], 0);
    EXPECT_EQ(j["object"], "text_completion");

    // max_tokens 1: the argmax next token and its log-probability.
    auto [st1, j1] = srv.post(
        "/v1/completions", json({{"prompt", prompt}, {"max_tokens", 1}, {"logprobs", 1}}).dump());
    ASSERT_EQ(st1, 200) << j1.dump();
    const RunResult last = alone(prompt);
    const json& lp1 = j1["choices"][0]["logprobs"];
    ASSERT_EQ(lp1["token_ids"].size(), 1u);
    if (test::top_gap(last.out.logits[0].f32(), V) > 1e-3) {
        EXPECT_EQ(lp1["token_ids"][0], last.first_tokens[0]);
    }
    const int32_t next = lp1["token_ids"][0];
    EXPECT_NEAR(double(lp1["token_logprobs"][0]),
                test::reference_logprob(last.out.logits[0].f32(), V, next), 1e-4);
    EXPECT_EQ(j1["usage"]["completion_tokens"], 1);
}

// Every kind of bad request gets its status and a JSON error naming the problem; the server
// answers a good request correctly afterwards.
TEST(Server, BadRequestsAreAnsweredAndNothingElseIsAffected) {
    test::ServerSetup s;
    s.max_prompt_tokens = 20;
    TestServer srv(s);
    const struct {
        std::string path, body;
        int status;
        std::string part;
    } cases[] = {
        {"/v1/prefill", "{\"input_ids\": [1, 2", 400, "not valid JSON"},
        {"/v1/prefill", R"({"input_ids": "abc"})", 400, "found a string"},
        {"/v1/prefill", R"({"input_ids": []})", 400, "empty"},
        {"/v1/prefill", R"({"input_ids": [1, 512]})", 400, "token id 512"},
        {"/v1/prefill", R"({"prompt": "hello"})", 400, "needs a tokenizer"},
        {"/v1/prefill", json({{"input_ids", std::vector<int32_t>(21, 1)}}).dump(), 413,
         "limit of 20"},
        {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 5})", 400, "does not decode"},
        {"/v1/completions", R"({"prompt": [1, 2], "stream": true})", 400, "nothing to stream"},
        {"/v1/nothing", "{}", 404, "no endpoint POST /v1/nothing"},
    };
    for (const auto& c : cases) {
        auto [st, j] = srv.post(c.path, c.body);
        EXPECT_EQ(st, c.status) << c.body;
        ASSERT_TRUE(j.contains("error")) << c.body << " → " << j.dump();
        EXPECT_EQ(j.size(), 1u) << j.dump();
        const std::string msg = j["error"]["message"];
        EXPECT_NE(msg.find(c.part), std::string::npos) << c.body << " → " << msg;
        EXPECT_TRUE(j["error"]["type"].is_string()) << j.dump();
        EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << "a source location: " << msg;
    }
    const std::vector<int32_t> good = {5, 6, 7, 8};
    auto [st, j] = srv.post("/v1/prefill", json({{"input_ids", good}, {"top_logprobs", 2}}).dump());
    ASSERT_EQ(st, 200) << j.dump();
    expect_matches_engine(j["requests"][0], good, 2, "after the bad requests");
}

// curl -d sends application/x-www-form-urlencoded, which httplib caps at 8 KiB before any
// handler: a long prompt sent so gets a 413 that says what to send instead.
TEST(Server, ALongFormEncodedBodyIs413NamingTheContentType) {
    TestServer srv;
    const std::string body = json({{"input_ids", std::vector<int32_t>(3000, 123)}}).dump();
    ASSERT_GT(body.size(), 8192u);
    auto r = srv.client()->Post("/v1/prefill", body, "application/x-www-form-urlencoded");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    const std::string msg = j["error"]["message"];
    EXPECT_NE(msg.find("Content-Type: application/json"), std::string::npos) << msg;
    // The same body as JSON is served.
    EXPECT_EQ(srv.post("/v1/prefill", body).first, 200);
}

TEST(Server, AFullQueueIs503WithRetryAfter) {
    test::ServerSetup s;
    s.hold_batches = true;
    s.max_queue = 2;
    TestServer srv(s);
    std::vector<int> status(3, 0);
    std::vector<std::thread> clients;
    for (int c = 0; c < 3; ++c) {
        clients.emplace_back([&, c] {
            status[c] = srv.post("/v1/prefill", json({{"input_ids", {c + 1, 2, 3}}}).dump()).first;
        });
        if (c == 0) {
            EXPECT_TRUE(eventually([&] { return srv.server().scheduler()->batch_held(); }));
        }
    }
    EXPECT_TRUE(eventually([&] { return srv.server().scheduler()->queue_length() == 2; }));
    std::string retry;
    auto [st, j] = srv.post("/v1/prefill", R"({"input_ids": [9, 9]})", &retry);
    EXPECT_EQ(st, 503);
    EXPECT_EQ(retry, "1");
    EXPECT_NE(j.dump().find("queue is full"), std::string::npos) << j.dump();
    srv.server().scheduler()->release_batch();
    srv.server().scheduler()->release_batch();
    for (auto& t : clients) t.join();
    EXPECT_EQ(status, (std::vector<int>{200, 200, 200}));
}

TEST(Server, AFailingBatchIs500ToItsRequestsAndServingGoesOn) {
    test::ServerSetup s;
    s.wrap = [](const std::vector<std::vector<int32_t>>& p, const RunOptions& ro,
                const BatchRunner& engine) {
        for (const auto& q : p)
            if (q == std::vector<int32_t>{7, 7, 7}) throw std::runtime_error("injected failure");
        return engine(p, ro);
    };
    TestServer srv(s);
    auto [st, j] = srv.post("/v1/prefill", R"({"input_ids": [7, 7, 7]})");
    EXPECT_EQ(st, 500);
    EXPECT_NE(j.dump().find("injected failure"), std::string::npos) << j.dump();
    const std::vector<int32_t> good = {1, 2, 3, 4, 5};
    auto [st2, j2] =
        srv.post("/v1/prefill", json({{"input_ids", good}, {"top_logprobs", 1}}).dump());
    ASSERT_EQ(st2, 200) << j2.dump();
    expect_matches_engine(j2["requests"][0], good, 1, "after the failed batch");
}

TEST(Server, HealthIs503UntilTheModelIsReady) {
    test::ServerSetup s;
    s.ready = false;
    TestServer srv(s);
    EXPECT_EQ(srv.get("/health").first, 503);
    std::string retry;
    EXPECT_EQ(srv.post("/v1/prefill", R"({"input_ids": [1]})", &retry).first, 503);
    EXPECT_EQ(retry, "1");
    auto [st, models] = srv.get("/v1/models");
    EXPECT_EQ(st, 200);
    EXPECT_EQ(json::parse(models)["data"][0]["vocab_size"], 512);
    srv.make_ready();
    EXPECT_EQ(srv.get("/health").first, 200);
    EXPECT_EQ(srv.post("/v1/prefill", R"({"input_ids": [1]})").first, 200);
}

// A client that sends its request and hangs up before the batch starts is dropped: its prompt
// never reaches the engine, and /metrics counts it as 499.
TEST(Server, AClientGoneBeforeItsBatchIsDropped) {
    std::atomic<int> prompts_run{0};
    test::ServerSetup s;
    s.hold_batches = true;
    s.wrap = [&](const std::vector<std::vector<int32_t>>& p, const RunOptions& ro,
                 const BatchRunner& engine) {
        prompts_run += static_cast<int>(p.size());
        return engine(p, ro);
    };
    TestServer srv(s);
    std::thread first([&] { srv.post("/v1/prefill", R"({"input_ids": [1, 2]})"); });
    // Joined on every path (the release lets the first request finish).
    struct Join {
        std::thread& t;
        Scheduler* s;
        ~Join() {
            s->release_batch();
            s->release_batch();
            t.join();
        }
    } join{first, srv.server().scheduler()};
    ASSERT_TRUE(eventually([&] { return srv.server().scheduler()->batch_held(); }));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(srv.port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string body = R"({"input_ids": [3, 4, 5]})";
    const std::string req =
        "POST /v1/prefill HTTP/1.1\r\nHost: x\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
    ASSERT_TRUE(eventually([&] { return srv.server().scheduler()->queue_length() == 1; }));
    close(fd);
    srv.server().scheduler()->release_batch();
    ASSERT_TRUE(eventually([&] {
        return srv.server().metrics().render({}).find("status=\"499\"} 1") != std::string::npos;
    }));
    EXPECT_EQ(prompts_run.load(), 1);  // the first request's prompt only
}

TEST(Server, MetricsCountWhatWasAnswered) {
    TestServer srv;
    EXPECT_EQ(srv.post("/v1/prefill", R"({"input_ids": [[1, 2, 3], [4, 5]]})").first, 200);
    EXPECT_EQ(srv.post("/v1/prefill", R"({"input_ids": [6, 7, 8, 9]})").first, 200);
    EXPECT_EQ(srv.post("/v1/prefill", R"({"input_ids": [600]})").first, 400);
    EXPECT_EQ(srv.post("/v1/completions", R"({"prompt": [1, 1], "max_tokens": 1})").first, 200);
    auto [st, text] = srv.get("/metrics");
    ASSERT_EQ(st, 200);
    const test::Samples m = test::parse_prometheus(text);
    EXPECT_EQ(m.sum("cpfill_requests_total"), 4);
    EXPECT_EQ(m.get("cpfill_requests_total{endpoint=\"prefill\",status=\"200\"}"), 2);
    EXPECT_EQ(m.get("cpfill_requests_total{endpoint=\"prefill\",status=\"400\"}"), 1);
    EXPECT_EQ(m.get("cpfill_requests_total{endpoint=\"completions\",status=\"200\"}"), 1);
    EXPECT_EQ(m.get("cpfill_prompt_tokens_total"), 5 + 4 + 2);
    EXPECT_EQ(m.get("cpfill_batch_tokens_total"), 5 + 4 + 2);
    EXPECT_EQ(m.get("cpfill_ttft_seconds_count"), 3);
    EXPECT_EQ(m.get("cpfill_queue_seconds_count"), 3);
    EXPECT_EQ(m.get("cpfill_queue_length"), 0);
    EXPECT_EQ(m.get("cpfill_ready"), 1);
    EXPECT_EQ(m.types.at("cpfill_ttft_seconds"), "histogram");
}

}  // namespace
}  // namespace cpfill::serve
