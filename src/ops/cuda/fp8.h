// fp8 e4m3 weights and activations with fp32 block scales, in the layouts cuBLASLt's block-scaled
// GEMM reads (gemm_fp8 in ops/cuda/gemm.h; docs/fp8.md). Weights are quantised once, at load, with
// power-of-two scales: a weight stored as e4m3 × a power-of-two block scale (the release's fp8
// linears, E8M0 128×128) comes back bit for bit, and any value that does not round-trip exactly is
// counted, never hidden. Activations are quantised per token and 128 channels with the scale
// amax / 448, as DeepSeek's inference does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemm.h"

namespace cpfill::ops::cuda {

constexpr float kFp8Max = 448.0f;  // largest finite e4m3

// fp32 scales of a [rows, cols] weight (ops/fp8_blocks.h; Row128 checks that cols is a multiple
// of 128).
int64_t fp8_weight_scales(int64_t rows, int64_t cols, Fp8Blocks blocks);

// w f32 [rows, cols] (device) → q e4m3 [rows, cols] and scale (fp8_weight_scales floats), each
// block's scale the least power of two with amax / scale ≤ 448 (1 for an all-zero block). Adds the
// number of values whose e4m3 · scale differs from w to *inexact (device counter; may be null).
void quantize_weight_fp8(const float* w, int64_t rows, int64_t cols, Fp8Blocks blocks, void* q,
                         float* scale, unsigned long long* inexact, cudaStream_t stream);

// x bf16 [n, K] (row stride ldx) → q e4m3 [n_pad, K] dense and scale [K/128][n_pad] (token
// fastest), one scale amax / 448 per token and 128 channels (1 where all are 0); rows n … n_pad − 1
// are zeros with scale 1 (padding to the GEMM's multiple of 4). K a multiple of 128.
void quantize_act_fp8(const __nv_bfloat16* x, int64_t ldx, int64_t n, int64_t K, void* q,
                      float* scale, cudaStream_t stream, int64_t n_pad = -1);

// The reverse of quantize_weight_fp8: out f32 [rows, cols] = q · scale (tests, and a bf16
// fallback).
void dequantize_weight_fp8(const void* q, const float* scale, int64_t rows, int64_t cols,
                           Fp8Blocks blocks, float* out, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
