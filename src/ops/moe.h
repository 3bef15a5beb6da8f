// MoE routing and SwiGLU experts (docs/architecture.md §3.8), fp32.
#pragma once

#include <cstdint>

namespace cpfill::ops {

// logits [n, n_experts] → idx [n, top_k], weight [n, top_k]. scores = sqrt(softplus(logits)).
// Learned routing (hash_ids == nullptr): idx = top-k of scores + bias (bias may be nullptr).
// Hash routing: idx = hash_ids[t] (given, [n, top_k]). weight = routed_scale · s_i / (Σ s + 1e-20).
void route(const float* logits, int64_t n, int n_experts, int top_k, const float* bias,
           const int64_t* hash_ids, float routed_scale, int32_t* idx, float* weight);

// In place on gate_up [n, 2·moe_dim] (gate half then up half) → act [n, moe_dim]:
// act = silu(min(gate, limit)) · clamp(up, −limit, limit); limit <= 0 disables the clamps.
void swiglu(const float* gate_up, int64_t n, int64_t moe_dim, float limit, float* act);

}  // namespace cpfill::ops
