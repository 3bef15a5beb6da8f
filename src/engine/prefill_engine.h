// PrefillEngine: what tools/ talks to. Loads a model folder, runs batches of requests and returns
// logits, first tokens and timings. CPU backend, one rank, for now.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "model/forward.h"
#include "model/weights.h"

namespace cpfill {

struct EngineOptions {
    int threads = 0;  // 0 = all hardware threads
};

struct RunResult {
    ForwardOutput out;
    std::vector<int32_t> first_tokens;  // argmax of each request's last-position logits
    int64_t n_tokens = 0;
    double prefill_seconds = 0;
};

class PrefillEngine {
  public:
    PrefillEngine(const std::string& model_dir, const EngineOptions& options);
    const ModelConfig& config() const { return weights_.cfg; }
    double load_seconds() const { return load_seconds_; }
    size_t weight_bytes() const { return weights_.bytes(); }
    // Validates the requests (non-empty, ids < vocab) and runs the prefill.
    RunResult run(const std::vector<std::vector<int32_t>>& requests, const ForwardOptions& opt);

  private:
    ModelWeights weights_;
    std::unique_ptr<ThreadPool> pool_;
    double load_seconds_ = 0;
};

// Index of the largest value (first one on ties).
int32_t argmax(const float* v, int64_t n);

}  // namespace cpfill
