// The CP / TBO engine, once for both backends (docs/parallel.md, "One engine"): a run plan
// (run_plan.h) driven through a rank's backend. Per chunk, per layer, the attention stages of all
// sub-batches, then their MoE stages — with two-batch overlap X(a) X(b) Y(a) Y(b), so that one
// sub-batch's exchanges run under the other's compute — then the last MoE finished and the head.
// The block itself (model/decoder_block.h) and the exchanges' collectives (exchange_plan.h) are
// defined once too; a backend (CPU ranks: cp_prefill.cpp; GPUs: cuda/gpu_runner.cu) implements
// the ops on its own memory, streams and communicators.
#pragma once

#include "model/decoder_block.h"
#include "parallel/run_plan.h"

namespace cpfill {

class RankBackend : public BlockOps {
  public:
    // The chunk's sub-batches become sub-batch states 0 … subs − 1 (layouts, local rows, the
    // residual from the embedding).
    virtual void begin_chunk(const ChunkPlan& chunk) = 0;
    // The residual of sub-batch s holds the embedding (records of hidden states).
    virtual void embedded(int /*s*/) {}
    // Before the stages of `layer` (timers, injected faults), and before the head.
    virtual void begin_layer(int /*layer*/) {}
    virtual void begin_head() {}
    // Final mHC collapse, norm and the logits of the rows the run wants.
    virtual void head(int s) = 0;
    virtual void end_chunk() {}
};

// One chunk through every layer and the head.
void run_chunk(RankBackend& b, const ChunkPlan& chunk, int n_layers);
// Every chunk of the plan, in order.
void run_plan(RankBackend& b, const RunPlan& plan, int n_layers);

}  // namespace cpfill
