// Compressor pooling (docs/architecture.md §3.5–3.7): per-channel softmax over the slots of a
// window of `ratio` tokens. HCA: slots = the window's tokens. CSA (overlap): 2·ratio slots = the
// Ca half (first dim channels) of window w−1's tokens and the Cb half (last dim channels) of window
// w's tokens; window 0 has no Ca slots (weight exactly 0).
#pragma once

#include <cstdint>

namespace cpfill::ops {

struct PoolSpec {
    int ratio;     // tokens per window (R)
    int64_t dim;   // output channels (head_dim or index_head_dim)
    bool overlap;  // CSA layout: projections are 2·dim wide
};

// kv, gate: [n_rows, width] projections (width = dim, or 2·dim with overlap) of consecutive tokens
// whose first row holds token position `row0` of the request; bias: [ratio, width] position bias.
// Writes out[w − w_begin, dim] for windows w in [w_begin, w_end). Needs rows for tokens
// (w_begin − overlap)·ratio … w_end·ratio − 1 (clipped at 0).
void compress_pool(const PoolSpec& spec, const float* kv, const float* gate, int64_t row0,
                   const float* bias, int64_t w_begin, int64_t w_end, float* out);

}  // namespace cpfill::ops
