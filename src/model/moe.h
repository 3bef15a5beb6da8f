// The MoE sub-block (docs/architecture.md §3.8) on the CPU backend: router (learned or hash) on all
// rows, each routed expert and the shared expert over the rows that use it. With an expert slice
// (tensor-parallel MoE) the result is this rank's partial sum; summing the partials of all slices
// gives the full output.
#pragma once

#include <cstdint>

#include "core/parallel.h"
#include "model/weights.h"

namespace cpfill {

// The MoE of layer L (its routing: L.mlp; activation rounding: L.activations). y: f32 [n, d_model]
// normed MoE input; tokens: [n] ids (hash routing); out: f32 [n, d_model]; routes (optional): i32
// [n, top_k] the experts each row was routed to, highest score first.
void moe_forward(const LayerWeights& L, const ModelConfig& cfg, const float* y,
                 const int32_t* tokens, int64_t n, float* out, ThreadPool& pool,
                 int32_t* routes = nullptr);

}  // namespace cpfill
