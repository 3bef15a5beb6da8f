// The server's life cycle and its small endpoints (health, models, metrics); the prefill and
// completions handlers are in handlers.cpp.
#include "serve/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>

#include "serve/http_error.h"

namespace cpfill::serve {

namespace {
void reply_json(httplib::Response& res, int status, const nlohmann::json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
}
}  // namespace

PrefillServer::PrefillServer(ServerOptions options)
    : opt_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
    if (opt_.limits.vocab_size == 0) opt_.limits.vocab_size = opt_.cfg.vocab_size;
    const size_t threads =
        opt_.http_threads > 0 ? size_t(opt_.http_threads) : opt_.scheduler.max_queue + 16;
    http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_->set_payload_max_length(size_t{1} << 30);
    // Responses go out as headers then body: without TCP_NODELAY, Nagle's algorithm holds the
    // body until the client's delayed ACK (~40 ms on Linux) on a kept-alive connection.
    http_->set_tcp_nodelay(true);
    add_routes();
}

PrefillServer::~PrefillServer() {
    stop();
    wait();
}

int PrefillServer::start(const std::string& host, int port) {
    int bound = port;
    if (port == 0) {
        bound = http_->bind_to_any_port(host);
    } else if (!http_->bind_to_port(host, port)) {
        bound = -1;
    }
    CPFILL_CHECK(bound > 0, "cannot listen on {}:{}: expected a free port on a local address", host,
                 port);
    listener_ = std::thread([this] { http_->listen_after_bind(); });
    // stop() must find the server running, or httplib's stop() would do nothing: wait for it
    // (bounded: 10 s is far beyond a thread start).
    for (int i = 0; i < 10000 && !http_->is_running(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CPFILL_CHECK(http_->is_running(), "the HTTP server on {}:{} did not start", host, bound);
    return bound;
}

void PrefillServer::set_ready(ReadyModel model) {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    model_ = std::move(model);
    scheduler_ = std::make_shared<Scheduler>(
        model_.runners, opt_.scheduler,
        [this](int64_t tokens, double s, bool ok) { metrics_.record_batch(tokens, s, ok); });
}

void PrefillServer::stop() {
    std::shared_ptr<Scheduler> s;
    {
        std::lock_guard lock(mu_);
        if (stopping_.exchange(true)) return;
        s = scheduler_;
    }
    http_->stop();         // no new connections
    if (s) s->shutdown();  // queued → 503, the running batch finishes
}

void PrefillServer::wait() {
    if (listener_.joinable()) listener_.join();  // returns once every handler has answered
}

Scheduler* PrefillServer::scheduler() {
    std::lock_guard lock(mu_);
    return scheduler_.get();
}

std::shared_ptr<Scheduler> PrefillServer::scheduler_or_503() {
    std::lock_guard lock(mu_);
    if (stopping_) throw HttpError(503, "unavailable", "the server is shutting down");
    if (!scheduler_)
        throw HttpError(503, "unavailable",
                        "the model is still loading: retry when GET /health answers 200");
    return scheduler_;
}

void PrefillServer::add_routes() {
    http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        std::lock_guard lock(mu_);
        const char* state = stopping_ ? "shutting down" : scheduler_ ? "ok" : "loading";
        reply_json(res, scheduler_ && !stopping_ ? 200 : 503, {{"status", state}});
    });
    http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        nlohmann::json m = {{"id", opt_.model_id},
                            {"object", "model"},
                            {"owned_by", "cpfill"},
                            {"vocab_size", opt_.cfg.vocab_size},
                            {"max_batch_tokens", opt_.scheduler.max_batch_tokens},
                            {"max_prompt_tokens", opt_.limits.max_prompt_tokens}};
        reply_json(res, 200, {{"object", "list"}, {"data", {m}}});
    });
    http_->Get("/metrics",
               [this](const httplib::Request&, httplib::Response& res) { handle_metrics(res); });
    http_->Post("/v1/prefill", [this](const httplib::Request& req, httplib::Response& res) {
        handle_prefill(req, res);
    });
    http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_completions(req, res);
    });
    // Errors httplib answers itself (unknown path, wrong method, a body over the size limit) get
    // the same JSON shape as ours; responses that already have a body keep it.
    http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                     httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg = fmt::format("HTTP status {}", res.status);
        if (res.status == 404)
            msg = fmt::format(
                "no endpoint {} {}: expected POST /v1/prefill, POST /v1/completions, GET /health, "
                "/v1/models or /metrics",
                req.method, req.path);
        // httplib caps form-encoded bodies (curl -d's default type) at 8 KiB, before any handler.
        if (res.status == 413 &&
            req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded"))
            msg =
                "a body over 8192 bytes sent as application/x-www-form-urlencoded (curl -d's "
                "default), which the HTTP library refuses: send it with the header Content-Type: "
                "application/json";
        res.set_content(error_body(msg, "invalid_request_error", res.status), "application/json");
        return httplib::Server::HandlerResponse::Handled;
    }));
}

void PrefillServer::handle_metrics(httplib::Response& res) {
    MetricsGauges g;
    std::shared_ptr<Scheduler> s;
    {
        std::lock_guard lock(mu_);
        s = scheduler_;
        g.ready = s && !stopping_;
        g.load_seconds = model_.load_seconds;
        g.warmup_seconds = model_.warmup_seconds;
        if (model_.gpu_bytes_in_use) g.gpu_bytes_in_use = model_.gpu_bytes_in_use();
    }
    if (s) {
        g.queue_length = s->queue_length();
        g.batches_running = s->batches_running();
        g.replicas = s->replicas();
    }
    res.set_content(metrics_.render(g), "text/plain; version=0.0.4");
}

}  // namespace cpfill::serve
