// The resident prefill server (docs/serve.md): cpp-httplib's HTTP server in front of the
// scheduler. It listens before the model is loaded so that GET /health can say 503 until the
// model is loaded and warm; set_ready() then hands it the batch runner. stop() is the graceful
// shutdown of SIGTERM: no new work, queued requests 503, the running batch finishes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/model_config.h"
#include "serve/metrics.h"
#include "serve/request_parse.h"
#include "serve/responses.h"
#include "serve/scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace cpfill::serve {

struct ServerOptions {
    std::string model_dir;
    std::string model_id;  // the name /v1/models and completions report
    ModelConfig cfg;       // read before the load: the vocabulary and limits are known at once
    PromptLimits limits;
    SchedulerOptions scheduler;
    Tokenize tokenize;         // empty: no tokenizer (text prompts are refused)
    Detokenize detokenize;     // empty: no token texts in the answers
    int http_threads = 0;      // 0: max_queue + 16 (every waiting request holds one)
    bool log_requests = true;  // one line per request on stderr
};

// What the server needs once the model is loaded.
struct ReadyModel {
    std::vector<BatchRunner> runners;  // one per replica (`serve --replicas`), at least one
    double load_seconds = 0;
    double warmup_seconds = 0;
    std::function<std::vector<size_t>()> gpu_bytes_in_use;  // cuda; may be empty
};

class PrefillServer {
  public:
    explicit PrefillServer(ServerOptions options);
    ~PrefillServer();
    PrefillServer(const PrefillServer&) = delete;
    PrefillServer& operator=(const PrefillServer&) = delete;

    // Binds (port 0: an ephemeral one) and starts serving on a thread of its own; returns the
    // port. Throws naming the address when the bind fails.
    int start(const std::string& host, int port);
    void set_ready(ReadyModel model);
    // Graceful stop (any thread, more than once): refuses new work, answers queued requests 503,
    // lets the running batch finish, closes the listener. wait() returns once all is answered.
    void stop();
    void wait();
    bool stopping() const { return stopping_; }

    // Tests: the scheduler once ready (null before), the counters.
    Scheduler* scheduler();
    const Metrics& metrics() const { return metrics_; }

  private:
    void add_routes();
    // The frame of every request handler (handlers.cpp serve_request): the body gets the request's
    // id and arrival time, and sets its prompt tokens and the batch's result for the log line.
    using RequestBody = std::function<void(uint64_t id, Clock::time_point t0, int64_t& tokens,
                                           std::optional<JobResult>& job)>;
    void serve_request(const char* endpoint, httplib::Response& res, const RequestBody& body);
    void handle_prefill(const httplib::Request& req, httplib::Response& res);
    void handle_completions(const httplib::Request& req, httplib::Response& res);
    void handle_metrics(httplib::Response& res);
    std::shared_ptr<Scheduler> scheduler_or_503();
    JobSpec job_spec(const httplib::Request& req, std::vector<std::vector<int32_t>> prompts,
                     bool all_logits, bool keep_kv);
    void log_request(const std::string& endpoint, uint64_t id, int status, int64_t tokens,
                     const JobResult* r, double total_s);

    ServerOptions opt_;
    std::unique_ptr<httplib::Server> http_;
    std::thread listener_;
    Metrics metrics_;
    mutable std::mutex mu_;
    std::shared_ptr<Scheduler> scheduler_;  // set by set_ready
    ReadyModel model_;
    std::atomic<bool> stopping_{false};
    std::atomic<uint64_t> next_id_{0};
};

}  // namespace cpfill::serve
