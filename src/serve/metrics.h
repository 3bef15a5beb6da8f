// The server's counters for GET /metrics, rendered in the Prometheus text exposition format
// (version 0.0.4; docs/serve.md "Metrics"). Thread-safe: handlers record requests, the worker
// records batches, a scrape renders a consistent snapshot under the same lock.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cpfill::serve {

// A cumulative histogram with fixed upper bounds (seconds).
struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, not cumulative; the last entry counts +Inf
    double sum = 0;
    uint64_t count = 0;
    explicit Histogram(std::vector<double> b);
    void observe(double v);
};

// What a scrape reads from elsewhere at that moment.
struct MetricsGauges {
    size_t queue_length = 0;
    int batches_running = 0;  // at most one per replica
    int replicas = 1;
    bool ready = false;
    double load_seconds = 0;
    double warmup_seconds = 0;
    std::vector<size_t> gpu_bytes_in_use;  // per GPU (cuda only)
};

class Metrics {
  public:
    Metrics();
    // One answered request: endpoint ("prefill", "completions"), HTTP status, prompt tokens
    // (counted only when the request was run), and for a run request its queue time and TTFT.
    void record_request(const std::string& endpoint, int status, int64_t prompt_tokens,
                        double queue_seconds, double ttft_seconds, bool ran);
    void record_batch(int64_t tokens, double seconds, bool ok);
    std::string render(const MetricsGauges& g) const;

  private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) → count
    uint64_t prompt_tokens_ = 0;
    uint64_t batches_ = 0, failed_batches_ = 0;
    uint64_t batch_tokens_ = 0;
    double batch_seconds_ = 0;
    double last_tokens_per_s_ = 0;
    Histogram ttft_, queue_;
};

}  // namespace cpfill::serve
