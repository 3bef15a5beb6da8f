// The plan of one prefill run, shared by both backends (docs/parallel.md, "One engine"): the
// flattened token stream cut into chunks (--chunk, or one pass), each chunk into one or two
// sub-batches (two-batch overlap, decided per chunk by the backend's rule). Segments of a request
// that began in an earlier chunk continue it through the KV store.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"
#include "parallel/cp_prefill.h"

namespace cpfill {

// One chunk of a run (the whole batch when not chunked).
struct ChunkPlan {
    Batch batch;
    int64_t stream_row0 = 0;  // first row of the chunk in the whole token stream
    bool tbo = false;
    std::vector<Batch> subs;          // 1 or 2 sub-batches
    std::vector<int64_t> row_offset;  // first row of each sub-batch in the chunk
};

// Everything one run needs to know besides the weights: the requests and the schedule.
struct RunPlan {
    std::vector<std::vector<int32_t>> const* requests = nullptr;
    int64_t n_tokens = 0;
    int64_t chunk = 0;  // tokens per chunk (0: one pass)
    std::vector<ChunkPlan> chunks;
    bool tbo() const;  // whether any chunk splits in two
};

// Whether `--tbo auto` splits a chunk of n_tokens on cp ranks: the CPU backend's tbo_pays, the
// CUDA backend's gpu_tbo_pays (cp_prefill.h).
using TboRule = bool (*)(const ModelConfig& cfg, int64_t n_tokens, int cp);
bool gpu_tbo_rule(const ModelConfig& cfg, int64_t n_tokens, int cp);  // gpu_tbo_pays, default model

// chunk > 0: chunks of at most `chunk` tokens of the flattened stream (make_chunks), each with its
// own TBO decision (On: every chunk of ≥ 2 tokens; Auto: `rule`); otherwise one pass. Validates
// the requests (validate_requests); the plan points at them, so they must outlive it.
RunPlan make_run_plan(const std::vector<std::vector<int32_t>>& requests, const ModelConfig& cfg,
                      int cp, TboMode tbo, int64_t chunk, TboRule rule);

}  // namespace cpfill
