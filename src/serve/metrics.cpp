// Prometheus text rendering of the server's counters.
#include "serve/metrics.h"

#include <fmt/format.h>

namespace cpfill::serve {

namespace {
// Seconds from 1 ms to 10 min: prefill TTFTs span a tiny model's milliseconds to a 1M-token
// prompt's minutes.
std::vector<double> time_buckets() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
            1,     2.5,    5,     10,   25,    50,   100, 250,  600};
}

void render_histogram(std::string& out, const std::string& name, const std::string& help,
                      const Histogram& h) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
        cum += h.counts[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
    }
    cum += h.counts.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name,
                       h.sum, name, h.count);
}

void render_one(std::string& out, const std::string& name, const std::string& type,
                const std::string& help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}
}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
}

Metrics::Metrics() : ttft_(time_buckets()), queue_(time_buckets()) {}

void Metrics::record_request(const std::string& endpoint, int status, int64_t prompt_tokens,
                             double queue_seconds, double ttft_seconds, bool ran) {
    std::lock_guard lock(mu_);
    ++requests_[{endpoint, status}];
    if (!ran) return;
    prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
    queue_.observe(queue_seconds);
    if (status == 200) ttft_.observe(ttft_seconds);
}

void Metrics::record_batch(int64_t tokens, double seconds, bool ok) {
    std::lock_guard lock(mu_);
    ++batches_;
    if (!ok) {
        ++failed_batches_;
        return;
    }
    batch_tokens_ += static_cast<uint64_t>(tokens);
    batch_seconds_ += seconds;
    if (seconds > 0) last_tokens_per_s_ = static_cast<double>(tokens) / seconds;
}

std::string Metrics::render(const MetricsGauges& g) const {
    std::lock_guard lock(mu_);
    std::string out;
    out +=
        "# HELP cpfill_requests_total Requests answered, by endpoint and HTTP status.\n"
        "# TYPE cpfill_requests_total counter\n";
    for (const auto& [key, n] : requests_)
        out += fmt::format("cpfill_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                           key.second, n);
    render_one(out, "cpfill_prompt_tokens_total", "counter",
               "Prompt tokens of the requests that reached a batch.", double(prompt_tokens_));
    render_one(out, "cpfill_batches_total", "counter", "Batches run (failed ones included).",
               double(batches_));
    render_one(out, "cpfill_batches_failed_total", "counter", "Batches whose run failed.",
               double(failed_batches_));
    render_one(out, "cpfill_batch_tokens_total", "counter", "Tokens of the successful batches.",
               double(batch_tokens_));
    render_one(out, "cpfill_prefill_seconds_total", "counter",
               "Seconds the successful batches ran (tokens/s = rate of the two).", batch_seconds_);
    render_one(out, "cpfill_tokens_per_second", "gauge", "Prefill throughput of the last batch.",
               last_tokens_per_s_);
    render_one(out, "cpfill_queue_length", "gauge", "Requests waiting for a batch.",
               double(g.queue_length));
    render_one(out, "cpfill_batch_running", "gauge",
               "Batches running (1 while a batch runs; at most one per replica).",
               double(g.batches_running));
    render_one(out, "cpfill_replicas", "gauge", "Model replicas, each running its own batches.",
               double(g.replicas));
    render_one(out, "cpfill_ready", "gauge", "1 once the model is loaded and warm.",
               g.ready ? 1 : 0);
    render_one(out, "cpfill_load_seconds", "gauge", "Seconds the model took to load.",
               g.load_seconds);
    render_one(out, "cpfill_warmup_seconds", "gauge", "Seconds the warm-up batch took.",
               g.warmup_seconds);
    render_histogram(out, "cpfill_queue_seconds", "Arrival to the start of the request's batch.",
                     queue_);
    render_histogram(out, "cpfill_ttft_seconds",
                     "Arrival to the first token (queue and prefill) of successful requests.",
                     ttft_);
    if (!g.gpu_bytes_in_use.empty()) {
        out +=
            "# HELP cpfill_gpu_memory_used_bytes Device memory in use, per GPU.\n"
            "# TYPE cpfill_gpu_memory_used_bytes gauge\n";
        for (size_t i = 0; i < g.gpu_bytes_in_use.size(); ++i)
            out += fmt::format("cpfill_gpu_memory_used_bytes{{gpu=\"{}\"}} {}\n", i,
                               g.gpu_bytes_in_use[i]);
    }
    return out;
}

}  // namespace cpfill::serve
