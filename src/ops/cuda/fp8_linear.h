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

// The quantised input of fp8_linear_quantised: n rows of `in` channels (a multiple of 128) exactly
// as fp8_linear's quantisation makes them, laid out so that both of its GEMMs read them in place.
// With body = n − n % 4 and n4 = n rounded up to a multiple of 4:
//   q      e4m3 [n4][in] dense, row r at q + r · in (the tail rows body … n4 − 1 follow the body:
//          the 4-row tail GEMM's input); rows n … n4 − 1 are zeros;
//   scale  [in/128][body] for the body rows (token fastest, ld = body: what quantize_act_fp8 makes
//          for the body GEMM), then [in/128][4] for rows body … n4 − 1 (ld = 4: the tail GEMM's,
//          rows n … n4 − 1 at 1, as quantize_act_fp8 pads them).
// A batch of such blocks (the attention's output for wo_a's groups, ops/cuda/attention.h) puts
// block gi's q at q + gi · q_bytes() and its scales at scale + gi · scale_count().
struct Fp8RowsLayout {
    int64_t n = 0, in = 0;

    __host__ __device__ int64_t body() const { return n / 4 * 4; }
    __host__ __device__ int64_t padded() const { return (n + 3) / 4 * 4; }
    __host__ __device__ int64_t q_bytes() const { return padded() * in; }
    __host__ __device__ int64_t scale_count() const { return padded() * (in / 128); }
    // Index in the block's scales of row r < padded(), channel block kb < in / 128.
    __host__ __device__ int64_t scale_at(int64_t r, int64_t kb) const {
        const int64_t b = body();
        return r < b ? kb * b + r : (in / 128) * b + kb * 4 + (r - b);
    }
};

// fp8_linear on an input already quantised in the Fp8RowsLayout {n, in} at xq / xs (rows n … n4 − 1
// included): the same GEMMs on the same bytes and scales, so the same y to the bit; only the tail's
// output (s.tail_y) comes from the scratch. xq 16-byte aligned.
void fp8_linear_quantised(GemmContext& ctx, const Fp8LinearScratch& s, const void* xq,
                          const float* xs, int64_t n, int64_t in, const void* w,
                          const float* w_scale, Fp8Blocks blocks, int64_t out,
                          __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream);

// Rows [begin, end) (within padded()) of each of `groups` Fp8RowsLayout {n, in} blocks at q /
// scale set to what quantize_act_fp8 makes of a zero row: zero bytes, scales 1 (padding rows).
void fp8_rows_zero(void* q, float* scale, int64_t n, int64_t in, int groups, int64_t begin,
                   int64_t end, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
