// The queue and its worker thread.
#include "serve/scheduler.h"

#include <fmt/format.h>

#include "core/error.h"
#include "serve/http_error.h"

namespace cpfill::serve {

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

JobResult failed(int status, const std::string& type, const std::string& message) {
    JobResult r;
    r.status = status;
    r.error_type = type;
    r.error_message = message;
    return r;
}
}  // namespace

Scheduler::Scheduler(BatchRunner run, const SchedulerOptions& options,
                     std::function<void(int64_t, double, bool)> on_batch)
    : Scheduler(std::vector<BatchRunner>{std::move(run)}, options, std::move(on_batch)) {}

Scheduler::Scheduler(std::vector<BatchRunner> runners, const SchedulerOptions& options,
                     std::function<void(int64_t, double, bool)> on_batch)
    : runners_(std::move(runners)), opt_(options), on_batch_(std::move(on_batch)) {
    CPFILL_CHECK(!runners_.empty(), "the scheduler needs at least one model replica");
    for (size_t r = 0; r < runners_.size(); ++r) workers_.emplace_back([this, r] { worker(r); });
}

Scheduler::~Scheduler() { shutdown(); }

std::future<JobResult> Scheduler::submit(JobSpec spec) {
    auto job = std::make_unique<Job>();
    for (const auto& p : spec.prompts) job->tokens += static_cast<int64_t>(p.size());
    if (!opt_.chunk_long && job->tokens > opt_.max_batch_tokens)
        throw HttpError(413, "invalid_request_error",
                        fmt::format("the request has {} tokens, more than --max-batch-tokens {}: "
                                    "this server does not split prompts into chunks; "
                                    "send fewer or shorter prompts, or start the server with a "
                                    "larger --max-batch-tokens",
                                    job->tokens, opt_.max_batch_tokens));
    job->spec = std::move(spec);
    job->arrival = Clock::now();
    std::future<JobResult> f = job->done.get_future();
    {
        std::lock_guard lock(mu_);
        if (stopping_)
            throw HttpError(503, "unavailable",
                            "the server is shutting down: expected no new "
                            "requests");
        if (queue_.size() >= opt_.max_queue)
            throw HttpError(503, "overloaded",
                            fmt::format("the queue is full ({} requests wait, --max-queue {}): "
                                        "retry later",
                                        queue_.size(), opt_.max_queue));
        queue_.push_back(std::move(job));
    }
    cv_.notify_all();
    return f;
}

size_t Scheduler::queue_length() const {
    std::lock_guard lock(mu_);
    return queue_.size();
}

int Scheduler::batches_running() const {
    std::lock_guard lock(mu_);
    return running_;
}

bool Scheduler::batch_held() const {
    std::lock_guard lock(mu_);
    return held_ > 0;
}

void Scheduler::release_batch() {
    {
        std::lock_guard lock(mu_);
        ++releases_;
    }
    cv_.notify_all();
}

void Scheduler::shutdown() {
    std::deque<std::unique_ptr<Job>> left;
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        left.swap(queue_);
    }
    cv_.notify_all();
    for (auto& job : left)
        job->done.set_value(
            failed(503, "unavailable", "the server shut down before this request's batch started"));
    for (auto& w : workers_)
        if (w.joinable()) w.join();
}

// The front of the queue, in arrival order, while it fits the token budget and asks for the same
// outputs (all-position logits, KV state) as the first job: a batch with all_logits computes the
// [len, vocab] logits of every request in it, which is what the others should not pay for.
std::vector<std::unique_ptr<Scheduler::Job>> Scheduler::next_batch(std::unique_lock<std::mutex>&) {
    std::vector<std::unique_ptr<Job>> batch;
    int64_t tokens = 0;
    while (!queue_.empty()) {
        Job& next = *queue_.front();
        if (next.spec.client_gone && next.spec.client_gone()) {
            JobResult r = failed(499, "client_closed",
                                 "the client closed the connection before the batch started");
            r.queue_seconds = seconds_between(next.arrival, Clock::now());
            next.done.set_value(std::move(r));
            queue_.pop_front();
            continue;
        }
        if (!batch.empty()) {
            const JobSpec& first = batch.front()->spec;
            if (tokens + next.tokens > opt_.max_batch_tokens) break;
            if (next.spec.all_logits != first.all_logits || next.spec.keep_kv != first.keep_kv)
                break;
        }
        tokens += next.tokens;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
    }
    return batch;
}

void Scheduler::worker(size_t replica) {
    std::unique_lock lock(mu_);
    while (true) {
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and shutdown() took what was queued
        std::vector<std::unique_ptr<Job>> batch = next_batch(lock);
        if (batch.empty()) continue;
        ++running_;
        if (opt_.hold_batches) {
            ++held_;
            cv_.wait(lock, [&] { return stopping_ || releases_ > 0; });
            if (releases_ > 0) --releases_;
            --held_;
        }
        lock.unlock();
        run_batch(runners_[replica], batch);
        lock.lock();
        --running_;
    }
}

void Scheduler::run_batch(const BatchRunner& run, std::vector<std::unique_ptr<Job>>& batch) {
    const Clock::time_point start = Clock::now();
    std::vector<std::vector<int32_t>> prompts;
    int64_t tokens = 0;
    for (auto& job : batch) {
        tokens += job->tokens;
        for (auto& p : job->spec.prompts) prompts.push_back(p);
    }
    RunOptions ro;
    ro.tbo = opt_.tbo;
    ro.all_logits = batch.front()->spec.all_logits;
    ro.keep_kv = batch.front()->spec.keep_kv;
    if (tokens > opt_.max_batch_tokens) ro.chunk = opt_.max_batch_tokens;  // one job
    RunResult r;
    std::string error;
    try {
        r = run(prompts, ro);
        const size_t n = prompts.size();
        if (r.out.logits.size() != n || r.first_tokens.size() != n ||
            (ro.keep_kv && r.out.kv.size() != n))
            error =
                fmt::format("the batch of {} prompts returned {} logits", n, r.out.logits.size());
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (on_batch_) on_batch_(tokens, error.empty() ? r.prefill_seconds : 0, error.empty());
    size_t p = 0;
    for (auto& job : batch) {
        JobResult res;
        if (!error.empty()) {
            res = failed(500, "server_error", "the batch holding this request failed: " + error);
        } else {
            for (size_t i = 0; i < job->spec.prompts.size(); ++i, ++p) {
                res.logits.push_back(std::move(r.out.logits[p]));
                res.first_tokens.push_back(r.first_tokens[p]);
                if (ro.keep_kv) res.kv.push_back(std::move(r.out.kv[p]));
            }
            res.prefill_seconds = r.prefill_seconds;
        }
        res.queue_seconds = seconds_between(job->arrival, start);
        res.batch_tokens = tokens;
        res.batch_jobs = batch.size();
        job->done.set_value(std::move(res));
    }
}

}  // namespace cpfill::serve
