// The indexer's scoring on Hopper (compute capability 9.0), used by indexer_topk
// (ops/cuda/indexer.h): one wgmma + TMA kernel for bf16 or e4m3 operands.
//  * bf16: the queries [n_q, n_heads, dim] and keys [n_entries, dim] are read as they are; the
//    tensor maps pad the heads to 64 and the dims to 128 with zeros.
//  * fp8: the queries' head rows and the keys become e4m3 rows of 128 bytes with a scale per row
//    (what ops::round_indexer_rows(Fp8) does on the CPU). A row's scale is folded into a factor: a
//    query head's into its head weight (ReLU(s·x) = s·ReLU(x) for s > 0), a key's (times the scale
//    dim^−½) into the factor that multiplies its scores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda::indexer_hopper {

constexpr int kPadHeads = 64;   // query heads per query, zero rows past n_heads
constexpr int kRowBytes = 128;  // e4m3 channels per row, zeros past dim

// Whether this GPU runs the scoring kernel (compute capability 9.0).
bool supported();

// Rows of x (bf16 [n_out / heads_out · heads_in, dim], dim ≤ 128 and a multiple of 4) → q e4m3
// [n_out, 128] and factor_out [n_out]: output row r is input row (r / heads_out) · heads_in +
// r % heads_out, or a zero pad row when r % heads_out ≥ heads_in (factor 0). factor_out = the row's
// scale × (mult[input row] when mult is set, else factor).
void quantize_rows(const __nv_bfloat16* x, int dim, int heads_in, int heads_out, int64_t n_out,
                   const float* mult, float factor, uint8_t* q, float* factor_out,
                   cudaStream_t stream);

// scores[t, e] = kfactor[e] · Σ_h wq[t, h] · ReLU(q8[t, h] · k8[e]) for t < rows and the eligible
// e < min((pos[t] + 1) / ratio, n_entries) (other entries untouched); q8 [rows, 64, 128],
// wq [rows, 64], k8 [n_entries, 128], scores rows of n_entries floats. q8 and k8 16-byte aligned;
// the caller has checked supported() (indexer_topk does, once per call).
void score_fp8(const uint8_t* q8, const float* wq, const int64_t* pos, int64_t rows,
               const uint8_t* k8, const float* kfactor, int64_t n_entries, int ratio, float* scores,
               cudaStream_t stream);

// scores[t, e] = scale · Σ_h weight[t, h] · ReLU(q[t, h] · keys[e]) over the same entries, from
// q bf16 [rows, n_heads, dim], weight [rows, n_heads], keys bf16 [n_entries, dim]: n_heads ≤ 64,
// dim ≤ 128 and a multiple of 8; q and keys 16-byte aligned; supported() checked by the caller.
void score_bf16(const __nv_bfloat16* q, const float* weight, int n_heads, int dim,
                const int64_t* pos, int64_t rows, const __nv_bfloat16* keys, float scale,
                int64_t n_entries, int ratio, float* scores, cudaStream_t stream);

}  // namespace cpfill::ops::cuda::indexer_hopper
