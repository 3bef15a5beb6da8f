// DeepSeek-V4 weights of one CP rank on its GPU (CUDA backend, docs/design.md §3): every matrix
// bf16, norms, mHC parameters, position biases, sinks and router biases fp32, tid2eid int64.
// Experts hold the rank's 1/C slice of their hidden width (slice units [I·p/C, I·(p+1)/C)), all
// experts of a layer in one buffer. Built either from host fp32 weights (upload) or generated on
// the device (benchmarks at real dimensions, nothing to read).
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/weights.h"
#include "runtime/cuda/buffer.h"

namespace cpfill::cuda {

struct GpuCompressor {
    DeviceBuffer wkv, wgate;  // bf16 [w · dim, d_model] (w = 2 with the CSA overlap)
    DeviceBuffer ape;         // f32 [ratio, w · dim]
    DeviceBuffer norm;        // f32 [dim]
};

struct GpuMhc {
    DeviceBuffer fn, base, scale;  // f32 [(2 + hc) · hc, hc · d_model], [(2 + hc) · hc], [3]
};

struct GpuLayer {
    AttnType type = AttnType::Sliding;
    MlpType mlp = MlpType::Learned;
    GpuMhc hc_attn, hc_ffn;
    DeviceBuffer attn_norm, ffn_norm;          // f32 [d_model]
    DeviceBuffer wq_a, wq_b, wkv, wo_a, wo_b;  // bf16, shapes as AttentionWeights
    DeviceBuffer q_norm, kv_norm, sink;        // f32 [q_rank], [head_dim], [n_heads]
    GpuCompressor comp, idx_comp;              // CSA / HCA; idx_comp CSA only
    DeviceBuffer idx_wq_b, idx_weights_proj;   // bf16, CSA only
    DeviceBuffer gate;                         // bf16 [n_experts, d_model]
    DeviceBuffer gate_bias;                    // f32 [n_experts] (learned routing)
    DeviceBuffer tid2eid;                      // i64 [vocab, top_k] (hash routing)
    DeviceBuffer w13;                          // bf16 [n_experts, 2 · width, d_model]
    DeviceBuffer w2;                           // bf16 [n_experts, d_model, width]
    DeviceBuffer shared_w13, shared_w2;        // bf16 [2 · width, d_model], [d_model, width]
};

struct GpuWeights {
    ModelConfig cfg;
    ExpertSlice slice;
    int64_t width = 0;                                     // expert hidden units on this rank
    DeviceBuffer embed, head;                              // bf16 [vocab, d_model]
    DeviceBuffer norm;                                     // f32 [d_model]
    DeviceBuffer hc_head_fn, hc_head_base, hc_head_scale;  // f32 [hc, hc·d_model], [hc], [1]
    DeviceBuffer inv_freq_main, inv_freq_compress;         // f32 [rope_dim / 2]
    std::vector<GpuLayer> layers;
    size_t bytes = 0;  // device bytes held
};

// Uploads a rank's host weights (as load_rank_weights / slice_experts make them) to the current
// device: upload_top, then upload_layer for every layer. Checks tid2eid values against n_experts.
GpuWeights upload_weights(const ModelWeights& host);
// The same in parts, so that the host needs to hold one layer at a time: the top-level tensors
// (embed, head, norm, hc_head; `host.layers` may be empty) with `layers` sized but empty, then
// layer `li` from its host weights. `bytes` counts what has been uploaded so far.
GpuWeights upload_top(const ModelWeights& host);
void upload_layer(GpuWeights& g, int li, const LayerWeights& host);

// Random weights of the shapes of `slice` of `cfg`, generated on the current device: normal-like
// (uniform with the same mean and deviation) per tensor family as io/random_checkpoint.h scales
// them, tid2eid rows of distinct experts. The same seed gives the same weights on every rank.
GpuWeights random_weights(const ModelConfig& cfg, ExpertSlice slice, uint64_t seed);

using cpfill::slice_width;  // model/weights.h

}  // namespace cpfill::cuda
