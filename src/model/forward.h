// The whole DeepSeek-V4 prefill on the CPU backend, one rank (dsv4-architecture.md §3):
// embedding → L × (mHC, attention, mHC, MoE) → hc_head → norm → lm head.
#pragma once

#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "model/batch.h"
#include "model/weights.h"

namespace cpfill {

struct ForwardOptions {
    bool all_logits = false;     // logits of every position instead of the last of each request
    bool record_hidden = false;  // keep the residual streams after the embedding and every layer
    bool record_topk = false;    // keep the indexer selections of CSA layers
};

struct ForwardOutput {
    std::vector<Tensor> logits;  // per request: f32 [vocab] (last position) or [len, vocab]
    // record_hidden: n_layers + 2 tensors: f32 [n_tokens, hc, d_model] after the embedding and
    // after each layer, then f32 [n_tokens, d_model] after hc_head and the final norm.
    std::vector<Tensor> hidden;
    // record_topk: per layer, i32 [n_tokens, index_topk] (CSA layers; undefined otherwise).
    std::vector<Tensor> topk;
};

ForwardOutput forward(const ModelWeights& w, const Batch& batch, const ForwardOptions& opt,
                      ThreadPool& pool);

}  // namespace cpfill
