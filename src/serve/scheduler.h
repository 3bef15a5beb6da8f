// The resident server's queue and batcher (docs/serve.md "Scheduling"): requests wait in arrival
// order; a worker thread per model replica (one, or `serve --replicas R`) takes from the front as
// many as fit into max_batch_tokens (at least one), runs them as one batch on its replica and
// hands each its share of the results; idle replicas take the next batches meanwhile. A request
// longer than the budget runs alone, in chunks of the budget (chunk_long; both backends chunk),
// else it is refused with 413 at submission. The batch runner is a function, so tests can put a
// fake model behind it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/prefill_engine.h"

namespace cpfill::serve {

using Clock = std::chrono::steady_clock;

struct JobSpec {
    std::vector<std::vector<int32_t>> prompts;
    bool all_logits = false;  // logits of every position (echo scoring)
    bool keep_kv = false;     // the KV state of each prompt (kv_out, return_kv)
    // Asked just before the job's batch starts; true drops the job (status 499). May be empty.
    std::function<bool()> client_gone;
};

struct JobResult {
    int status = 200;  // 200; 499 client gone; 500 the batch failed; 503 shut down
    std::string error_type, error_message;
    std::vector<Tensor> logits;  // per prompt: f32 [vocab], or [len, vocab] with all_logits
    std::vector<int32_t> first_tokens;
    KvStore kv;                  // per prompt, with keep_kv
    double queue_seconds = 0;    // arrival → batch start
    double prefill_seconds = 0;  // the batch's run
    int64_t batch_tokens = 0;
    size_t batch_jobs = 0;
};

using BatchRunner =
    std::function<RunResult(const std::vector<std::vector<int32_t>>&, const RunOptions&)>;

struct SchedulerOptions {
    int64_t max_batch_tokens = 8192;
    size_t max_queue = 64;   // waiting jobs; one more is refused with 503
    bool chunk_long = true;  // over-budget jobs run in chunks; false: 413 at submission
    TboMode tbo = TboMode::Auto;
    bool hold_batches = false;  // tests: each batch waits for release_batch() or shutdown()
};

class Scheduler {
  public:
    // on_batch (may be empty) is called from a worker after each batch: tokens, seconds, ok.
    Scheduler(BatchRunner run, const SchedulerOptions& options,
              std::function<void(int64_t, double, bool)> on_batch = {});
    // One worker per runner (a model replica each); at least one runner.
    Scheduler(std::vector<BatchRunner> runners, const SchedulerOptions& options,
              std::function<void(int64_t, double, bool)> on_batch = {});
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a job; throws HttpError 503 (queue full, shutting down) or 413 (over the budget
    // where nothing chunks).
    std::future<JobResult> submit(JobSpec spec);
    size_t queue_length() const;
    int batches_running() const;  // at most one per replica
    int replicas() const { return static_cast<int>(runners_.size()); }
    // Tests (hold_batches): true while a formed batch waits; release_batch lets one run.
    bool batch_held() const;
    void release_batch();
    // Stops taking jobs, answers the queued ones 503, lets the running batch finish, joins.
    void shutdown();

  private:
    struct Job {
        JobSpec spec;
        Clock::time_point arrival;
        int64_t tokens = 0;
        std::promise<JobResult> done;
    };
    void worker(size_t replica);
    std::vector<std::unique_ptr<Job>> next_batch(std::unique_lock<std::mutex>& lock);
    void run_batch(const BatchRunner& run, std::vector<std::unique_ptr<Job>>& batch);

    std::vector<BatchRunner> runners_;
    SchedulerOptions opt_;
    std::function<void(int64_t, double, bool)> on_batch_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Job>> queue_;
    bool stopping_ = false;
    int running_ = 0;  // batches running (one per busy replica)
    int held_ = 0;     // formed batches waiting for release_batch (tests)
    int releases_ = 0;
    std::vector<std::thread> workers_;
};

}  // namespace cpfill::serve
