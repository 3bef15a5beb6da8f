// Compressor pooling on the GPU (docs/architecture.md §3.5–3.7), the semantics of
// ops/compressor.h: a per-channel softmax over the slots of a window (fp32, docs/design.md §3),
// then the softmax-weighted sum of the slots' kv. HCA: slots = the window's `ratio` tokens. CSA
// (overlap): 2·ratio slots = the Ca half (first dim channels) of window w−1's tokens and the Cb
// half (last dim channels) of window w's tokens; window 0 has no Ca slots (weight exactly 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

struct PoolSpec {
    int ratio;     // tokens per window (R)
    int64_t dim;   // output channels (head_dim or index_head_dim)
    bool overlap;  // CSA layout: projections are 2·dim wide
};

// kv, gate: bf16 rows of consecutive tokens, row stride ld (≥ width = dim, or 2·dim with overlap;
// kv and gate may be two column ranges of one packed row), whose first row is token `row0` of the
// request; bias: fp32 [ratio, width] position bias. Writes out bf16 [w_end − w_begin, dim] for
// windows [w_begin, w_end) (bf16 as the reference rounds it before kv_norm). Needs the rows of
// tokens max(0, (w_begin − overlap)·ratio) … w_end·ratio − 1.
void compress_pool(const PoolSpec& spec, const __nv_bfloat16* kv, const __nv_bfloat16* gate,
                   int64_t ld, int64_t row0, const float* bias, int64_t w_begin, int64_t w_end,
                   __nv_bfloat16* out, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
