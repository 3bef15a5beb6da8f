// The GPU's activation rounding on the CPU backend, for numerics studies (docs/fp8.md,
// "Fidelity"; docs/numerics.md, "The residual in bf16"): where the CUDA backend runs a linear in
// fp8, it quantises the input per (row, 128 channels) to e4m3 with the block's scale amax / 448
// (1 when all are 0; ops/cuda/fp8.h quantize_act_fp8) and accumulates q · scale in fp32; its bf16
// path feeds the same linears bf16 inputs. Here the input is rounded to those values and the fp32
// product runs as usual, so the only difference left is the rounding of the input.
#pragma once

#include <cstdint>

#include "core/parallel.h"

namespace cpfill::ops {

// How the inputs of the linears listed in model/weights.h (LayerWeights::activations) are rounded:
// not at all (the fp32 reference), to bf16 (nearest even), or to fp8 blocks as above.
enum class ActRounding { None, Bf16, Fp8 };

// y[n, k] (contiguous) = x[n, k] (row stride ldx) rounded per 128-channel block as above; k a
// multiple of 128.
void round_fp8_blocks(const float* x, int64_t n, int64_t k, int64_t ldx, float* y);

// linear(pool, …) of x, first rounded as `r` says (into a scratch of n · in).
void linear_act(ThreadPool& pool, ActRounding r, const float* x, int64_t n, int64_t in, int64_t ldx,
                const float* w, int64_t out, float* y, int64_t ldy);

inline void linear_act(ThreadPool& pool, ActRounding r, const float* x, int64_t n, int64_t in,
                       const float* w, int64_t out, float* y) {
    linear_act(pool, r, x, n, in, in, w, out, y, out);
}

}  // namespace cpfill::ops
