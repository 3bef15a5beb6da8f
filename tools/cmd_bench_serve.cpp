// cpfill bench-serve: a load generator for `cpfill serve` (docs/serve.md "Benchmark"). For each
// prompt length and concurrency it sends --requests prefill requests of random token ids (below
// the vocabulary /v1/models reports, or --vocab) from that many client threads, each sending its
// next request as soon as the last is answered, and reports TTFT (request sent → answer, which
// holds the first token) p50/p99 and the throughput, as SGLang's bench_serving does.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "tools/cli_options.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
    std::string url = "http://127.0.0.1:8000";
    std::string concurrency = "1,8,32";
    std::string lengths = "1k,8k";
    int requests = 64;
    int64_t vocab = 0;
    uint64_t seed = 0;
    std::string json_out;
};

struct Point {
    int64_t length = 0;
    int concurrency = 0;
    int ok = 0, failed = 0;
    double seconds = 0;
    std::vector<double> ttft_ms;  // of the successful requests
};

// "http://host:port" → host and port.
std::pair<std::string, int> parse_url(const std::string& url) {
    const std::string prefix = "http://";
    CPFILL_CHECK(url.rfind(prefix, 0) == 0, "--url {}: expected http://HOST:PORT", url);
    std::string rest = url.substr(prefix.size());
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    CPFILL_CHECK(colon != std::string::npos && colon + 1 < rest.size(),
                 "--url {}: expected http://HOST:PORT (the port is missing)", url);
    const std::string port = rest.substr(colon + 1);
    CPFILL_CHECK(std::all_of(port.begin(), port.end(), ::isdigit) && port.size() <= 5,
                 "--url {}: the port \"{}\" is not a number", url, port);
    return {rest.substr(0, colon), std::stoi(port)};
}

int64_t server_vocab(httplib::Client& cli, const std::string& url) {
    auto r = cli.Get("/v1/models");
    CPFILL_CHECK(r, "{}: cannot reach the server ({}): is `cpfill serve` running there?", url,
                 httplib::to_string(r.error()));
    CPFILL_CHECK(r->status == 200, "{}/v1/models answered HTTP {}: expected 200", url, r->status);
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    CPFILL_CHECK(!j.is_discarded() && j.contains("data") && !j["data"].empty() &&
                     j["data"][0].contains("vocab_size"),
                 "{}/v1/models: expected a model with vocab_size; give --vocab", url);
    return j["data"][0]["vocab_size"].get<int64_t>();
}

Point run_point(const std::string& host, int port, int64_t length, int concurrency, int requests,
                int64_t vocab, uint64_t seed) {
    // The bodies first, so that generating them is not timed.
    std::mt19937_64 rng(seed ^ (uint64_t(length) << 20) ^ uint64_t(concurrency));
    std::uniform_int_distribution<int64_t> id(0, vocab - 1);
    std::vector<std::string> bodies;
    for (int r = 0; r < requests; ++r) {
        std::vector<int64_t> ids(static_cast<size_t>(length));
        for (auto& x : ids) x = id(rng);
        bodies.push_back(nlohmann::json({{"input_ids", ids}}).dump());
    }
    Point p;
    p.length = length;
    p.concurrency = concurrency;
    std::atomic<int> next{0};
    std::mutex mu;
    const Clock::time_point t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < concurrency; ++c)
        clients.emplace_back([&] {
            httplib::Client cli(host, port);
            cli.set_read_timeout(3600, 0);
            cli.set_keep_alive(true);
            cli.set_tcp_nodelay(true);  // requests go out as headers, then body
            for (int r; (r = next++) < requests;) {
                const Clock::time_point s = Clock::now();
                auto res = cli.Post("/v1/prefill", bodies[size_t(r)], "application/json");
                const double ms =
                    std::chrono::duration<double, std::milli>(Clock::now() - s).count();
                std::lock_guard lock(mu);
                if (res && res->status == 200) {
                    ++p.ok;
                    p.ttft_ms.push_back(ms);
                } else {
                    ++p.failed;
                }
            }
        });
    for (auto& t : clients) t.join();
    p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::sort(p.ttft_ms.begin(), p.ttft_ms.end());
    return p;
}

double percentile(const std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0;
    const size_t i = static_cast<size_t>(std::ceil(q * double(sorted.size()))) - 1;
    return sorted[std::min(i, sorted.size() - 1)];
}

nlohmann::json point_json(const Point& p) {
    double mean = 0;
    for (double v : p.ttft_ms) mean += v / double(p.ttft_ms.size());
    return {{"length", p.length},
            {"concurrency", p.concurrency},
            {"ok", p.ok},
            {"failed", p.failed},
            {"seconds", p.seconds},
            {"ttft_ms",
             {{"p50", percentile(p.ttft_ms, 0.5)},
              {"p99", percentile(p.ttft_ms, 0.99)},
              {"mean", mean}}},
            {"requests_per_s", p.ok / p.seconds},
            {"input_tokens_per_s", double(p.ok) * double(p.length) / p.seconds}};
}

int bench_serve(const BenchServeArgs& a) {
    const auto [host, port] = parse_url(a.url);
    std::vector<int64_t> lengths;
    for (const auto& s : split_list(a.lengths, "--lengths"))
        lengths.push_back(parse_count(s, "--lengths"));
    std::vector<int> conc;
    for (const auto& s : split_list(a.concurrency, "--concurrency")) {
        const int64_t c = parse_count(s, "--concurrency");
        CPFILL_CHECK(c <= 4096, "--concurrency {}: expected at most 4096 clients", c);
        conc.push_back(static_cast<int>(c));
    }
    httplib::Client cli(host, port);
    cli.set_read_timeout(60, 0);
    const int64_t vocab = a.vocab > 0 ? a.vocab : server_vocab(cli, a.url);
    fmt::print("{:>8} {:>11} {:>8} {:>6} {:>12} {:>12} {:>12} {:>9} {:>12}\n", "length",
               "concurrency", "requests", "failed", "TTFT p50 ms", "TTFT p99 ms", "mean ms",
               "req/s", "tokens/s");
    nlohmann::json all = nlohmann::json::array();
    for (int64_t len : lengths)
        for (int c : conc) {
            const Point p = run_point(host, port, len, c, a.requests, vocab, a.seed);
            const nlohmann::json j = point_json(p);
            all.push_back(j);
            fmt::print(
                "{:>8} {:>11} {:>8} {:>6} {:>12.1f} {:>12.1f} {:>12.1f} {:>9.2f} {:>12.0f}\n", len,
                c, p.ok + p.failed, p.failed, j["ttft_ms"]["p50"].get<double>(),
                j["ttft_ms"]["p99"].get<double>(), j["ttft_ms"]["mean"].get<double>(),
                j["requests_per_s"].get<double>(), j["input_tokens_per_s"].get<double>());
            std::fflush(stdout);
        }
    if (!a.json_out.empty()) {
        std::ofstream f(a.json_out);
        CPFILL_CHECK(f.good(), "--json {}: cannot create the file", a.json_out);
        f << nlohmann::json({{"url", a.url}, {"vocab", vocab}, {"points", all}}).dump(1) << "\n";
    }
    return 0;
}

}  // namespace

Runner add_bench_serve_command(CLI::App& app) {
    auto a = std::make_shared<BenchServeArgs>();
    CLI::App* c =
        app.add_subcommand("bench-serve", "load generator for cpfill serve (docs/serve.md)");
    c->add_option("--url", a->url, "the server (default http://127.0.0.1:8000)");
    c->add_option("--concurrency", a->concurrency, "client threads, a list (default 1,8,32)");
    c->add_option("--lengths", a->lengths, "prompt lengths, a list (default 1k,8k; k = 1024)");
    c->add_option("--requests", a->requests, "requests per point (default 64)")
        ->check(CLI::Range(1, 1000000));
    c->add_option("--vocab", a->vocab, "token ids below this (default: the server's vocab_size)")
        ->check(CLI::PositiveNumber);
    c->add_option("--seed", a->seed, "seed of the random prompts");
    c->add_option("--json", a->json_out, "also write the points to this JSON file");
    return [a] { return bench_serve(*a); };
}

}  // namespace cpfill::tools
