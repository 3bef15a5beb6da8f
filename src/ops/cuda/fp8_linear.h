// A linear layer with an fp8 weight on bf16 activations: quantise the activation per token and 128
// channels (quantize_act_fp8), then a block-scaled GEMM — cuBLASLt's (gemm_fp8), or cpfill's
// grouped fp8 kernel as one expert (Fp8DenseGemm). Any row count: the GEMM needs a multiple of 4,
// so the last n % 4 rows go through a 4-row tail (zero padding, cuBLASLt) and are copied into
// place. docs/fp8.md.
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

// Which GEMM multiplies the rows in multiples of 4 (docs/fp8.md, "The dense fp8 GEMMs"): cuBLASLt's
// block-scaled GEMM, or cpfill's grouped fp8 kernel (ops/cuda/grouped_fp8.h) as one expert, which
// takes bf16 outputs of 128×128-tiled weights with in and out multiples of 128 on a Hopper GPU (the
// rest stays on cuBLASLt). The environment variable CPFILL_FP8_GEMM=cublas|cpfill picks it for the
// process; unset: cublas (the measured one, until the other is timed in the model).
enum class Fp8DenseGemm { Cublas, Cpfill };
Fp8DenseGemm fp8_dense_gemm();                       // CPFILL_FP8_GEMM, read once per process
Fp8DenseGemm parse_fp8_dense_gemm(const char* env);  // null: unset; an unknown name is an error
const char* fp8_dense_gemm_name(Fp8DenseGemm g);     // "cublas", "cpfill"
// Whether `g` would run the grouped kernel for this linear (on the current GPU).
bool fp8_linear_grouped(Fp8DenseGemm g, Fp8Blocks blocks, int64_t in, int64_t out,
                        const __nv_bfloat16* y_bf16, int64_t ldy);

// y[n, out] (bf16 y_bf16 or fp32 y_f32, row stride ldy) = x[n, in] (bf16, row stride ldx) · wᵀ,
// w e4m3 [out, in] scaled as `blocks` says (ops/cuda/fp8.h). in a multiple of 128; n · in and in
// within the scratch's plan.
void fp8_linear(GemmContext& ctx, const Fp8LinearScratch& s, const __nv_bfloat16* x, int64_t ldx,
                int64_t n, int64_t in, const void* w, const float* w_scale, Fp8Blocks blocks,
                int64_t out, __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream,
                Fp8DenseGemm gemm = fp8_dense_gemm());

}  // namespace cpfill::ops::cuda
