// The GPU's fp8 activations on the CPU backend, for numerics studies (docs/fp8.md, "Fidelity"):
// where the CUDA backend runs a linear in fp8, it quantises the input per (row, 128 channels) to
// e4m3 with the block's scale amax / 448 (1 when all are 0; ops/cuda/fp8.h quantize_act_fp8) and
// accumulates q · scale in fp32. Here the input is rounded to those values and the fp32 product
// runs as usual, so the only difference left is the rounding of the input.
#pragma once

#include <cstdint>

#include "core/parallel.h"

namespace cpfill::ops {

// y[n, k] (contiguous) = x[n, k] (row stride ldx) rounded per 128-channel block as above; k a
// multiple of 128.
void round_fp8_blocks(const float* x, int64_t n, int64_t k, int64_t ldx, float* y);

// linear(pool, …) of x, first rounded by round_fp8_blocks when fp8 (into a scratch of n · in).
void linear_act(ThreadPool& pool, bool fp8, const float* x, int64_t n, int64_t in, int64_t ldx,
                const float* w, int64_t out, float* y, int64_t ldy);

inline void linear_act(ThreadPool& pool, bool fp8, const float* x, int64_t n, int64_t in,
                       const float* w, int64_t out, float* y) {
    linear_act(pool, fp8, x, n, in, in, w, out, y, out);
}

}  // namespace cpfill::ops
