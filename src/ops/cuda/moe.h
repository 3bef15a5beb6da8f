// MoE routing and the SwiGLU activation on the GPU (docs/architecture.md §3.8, the semantics of
// ops/moe.h). Router scores in fp32 (docs/design.md §3); the activation reads and writes bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// logits fp32 [n, n_experts] → idx [n, top_k], weight fp32 [n, top_k]; scores = sqrt(softplus).
// Learned routing (hash_ids == nullptr): idx = top-k of scores + bias (bias fp32 [n_experts] or
// nullptr), highest first, lower expert index on ties. Hash routing: idx = hash_ids[t] (int64
// [n, top_k]). weight = routed_scale · s_i / (Σ s + 1e-20); the bias never enters it.
// n_experts ≤ 1024, top_k ≤ 32.
void route(const float* logits, int64_t n, int n_experts, int top_k, const float* bias,
           const int64_t* hash_ids, float routed_scale, int32_t* idx, float* weight,
           cudaStream_t stream);

// gate_up bf16 [n, 2·moe_dim] (gate half, then up half) → act bf16 [n, moe_dim]:
// act = silu(min(gate, limit)) · clamp(up, −limit, limit) (· row_scale[t] when row_scale, fp32
// [n], is given: the routing weight applied before the down projection); limit ≤ 0: no clamps.
void swiglu(const __nv_bfloat16* gate_up, int64_t n, int64_t moe_dim, float limit,
            const float* row_scale, __nv_bfloat16* act, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
