// PrefillEngine: checkpoint → fp32 weights, thread pool sized once, forward with timing.
#include "engine/prefill_engine.h"

#include <chrono>

#include "io/checkpoint.h"
#include "model/batch.h"
#include "ops/linear.h"

namespace cpfill {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

PrefillEngine::PrefillEngine(const std::string& model_dir, const EngineOptions& options) {
    auto t0 = std::chrono::steady_clock::now();
    Checkpoint ckpt(model_dir);
    weights_ = load_weights(ckpt);
    int threads = options.threads > 0 ? options.threads : default_thread_count();
    pool_ = std::make_unique<ThreadPool>(threads);
    ops::set_blas_threads(1);  // parallelism comes from the pool (ops/linear.h)
    load_seconds_ = seconds_since(t0);
}

RunResult PrefillEngine::run(const std::vector<std::vector<int32_t>>& requests,
                             const ForwardOptions& opt) {
    Batch batch = make_batch(requests, weights_.cfg.vocab_size);
    auto t0 = std::chrono::steady_clock::now();
    RunResult r;
    r.out = forward(weights_, batch, opt, *pool_);
    r.prefill_seconds = seconds_since(t0);
    r.n_tokens = batch.n_tokens();
    const int64_t V = weights_.cfg.vocab_size;
    for (const Tensor& l : r.out.logits) {
        const float* last = l.f32() + (l.ndim() == 2 ? (l.dim(0) - 1) * V : 0);
        r.first_tokens.push_back(argmax(last, V));
    }
    return r;
}

int32_t argmax(const float* v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return static_cast<int32_t>(best);
}

}  // namespace cpfill
