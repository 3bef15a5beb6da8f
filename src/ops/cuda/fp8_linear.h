// A linear layer with an fp8 weight on bf16 activations: quantise the activation per token and 128
// channels (quantize_act_fp8), then cuBLASLt's block-scaled GEMM (gemm_fp8). Any row count: the
// GEMM needs a multiple of 4, so the last n % 4 rows go through a 4-row tail (zero padding) and are
// copied into place. docs/fp8.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemm.h"

namespace cpfill::ops::cuda {

// Scratch of fp8_linear, planned up front: the quantised activation of up to `capacity` values (n ·
// in), and the tail's activation, scales and output (4 rows of up to `cols` in, `out` out).
struct Fp8LinearScratch {
    void* q = nullptr;            // e4m3 [capacity]
    float* scale = nullptr;       // [capacity / 128]
    void* tail_q = nullptr;       // e4m3 [4, cols]
    float* tail_scale = nullptr;  // [4 · cols / 128]
    float* tail_y = nullptr;      // [4, out] (bf16 or fp32 output)
    int64_t capacity = 0, cols = 0, out = 0;
};

// y[n, out] (bf16 y_bf16 or fp32 y_f32, row stride ldy) = x[n, in] (bf16, row stride ldx) · wᵀ,
// w e4m3 [out, in] scaled as `blocks` says (ops/cuda/fp8.h). in a multiple of 128; n · in and in
// within the scratch's plan.
void fp8_linear(GemmContext& ctx, const Fp8LinearScratch& s, const __nv_bfloat16* x, int64_t ldx,
                int64_t n, int64_t in, const void* w, const float* w_scale, Fp8Blocks blocks,
                int64_t out, __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
