// PrefillEngine: checkpoint → every rank's fp32 weights (parallel load); runs with timing.
#include "engine/prefill_engine.h"

#include <chrono>

#include "core/parallel.h"
#include "io/checkpoint.h"
#include "model/batch.h"

namespace cpfill {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

PrefillEngine::PrefillEngine(const std::string& model_dir, const EngineOptions& options)
    : options_(options) {
    auto t0 = std::chrono::steady_clock::now();
    CPFILL_CHECK(options.cp >= 1 && options.cp <= 64, "--cp {}: expected 1 to 64 CPU ranks",
                 options.cp);
    Checkpoint ckpt(model_dir);
    const ModelConfig& cfg = ckpt.config();
    CPFILL_CHECK(cfg.moe_dim >= options.cp,
                 "--cp {}: the experts' width moe_intermediate_size {} cannot be split over more "
                 "ranks than it has units (expected --cp <= {})",
                 options.cp, cfg.moe_dim, cfg.moe_dim);
    cfg_ = cfg;
    LoadOptions load;
    load.threads = options.threads > 0 ? options.threads : default_thread_count();
    load.progress = true;  // drawn only when stderr is a terminal and the load takes over 1 s
    LoadStats stats;
    ranks_ = load_rank_weights(ckpt, options.cp, load, &stats);
    load_bytes_ = stats.stored_bytes;
    load_seconds_ = seconds_since(t0);
}

RunResult PrefillEngine::run(const std::vector<std::vector<int32_t>>& requests,
                             const RunOptions& opt) {
    validate_requests(requests, config().vocab_size);
    PrefillOptions p;
    p.cp = options_.cp;
    p.tbo = opt.tbo;
    p.chunk = opt.chunk;
    p.threads = options_.threads;
    p.all_logits = opt.all_logits;
    p.record_hidden = opt.record_hidden;
    p.record_topk = opt.record_topk;
    p.comm = options_.comm;
    std::vector<const ModelWeights*> views;
    for (const auto& w : ranks_) views.push_back(&w);
    auto t0 = std::chrono::steady_clock::now();
    RunResult r;
    r.out = cp_prefill(views, requests, p);
    r.prefill_seconds = seconds_since(t0);
    r.n_tokens = r.out.n_tokens;
    const int64_t V = config().vocab_size;
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
