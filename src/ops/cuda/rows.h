// Row plumbing of the GPU forward: the CP rerange (docs/design.md §4), the embedding into mHC
// streams, hash-routing lookups, scaling and dtype conversion. Launchers take raw device pointers
// and an explicit stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// in: rank-major gathered rows [cp · n_local, row_bytes] (row k·n_local + j holds token j·cp + k)
// → out rows 0 … n_out − 1 in global order, row stride ld_out bytes (≥ row_bytes). Rows ≥ n_out
// (padding) are not written. cp strided copies (cudaMemcpy2DAsync), no kernel.
void rerange_rows(const void* in, int cp, int64_t n_local, int64_t row_bytes, int64_t n_out,
                  void* out, int64_t ld_out, cudaStream_t stream);

// h [n, hc, d_model] ← embed[tokens[t]] (bf16 [vocab, d_model]) in streams 0 … written − 1 of
// each row (written: hc, or 1 where the first site and boundary read stream 0 for all:
// mhc_pre_first, mhc_post_pre_first; the other streams are left as they are); h fp32 or bf16 (the
// residual's two forms, ops/cuda/mhc.h: the bf16 values are copied as they are).
void embed_streams(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n, int64_t d_model,
                   int hc, int written, float* h, cudaStream_t stream);
void embed_streams(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n, int64_t d_model,
                   int hc, int written, __nv_bfloat16* h, cudaStream_t stream);

// out int64 [n, top_k] ← tid2eid[tokens[t]] (int64 [vocab, top_k]).
void hash_lookup(const int64_t* tid2eid, const int32_t* tokens, int64_t n, int top_k, int64_t* out,
                 cudaStream_t stream);

void scale_f32(float* x, int64_t n, float s, cudaStream_t stream);
// y bf16 [n] ← x fp32 [n] (round to nearest even).
void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* y, cudaStream_t stream);
// out[i] = i · step for i < n.
void iota_i64(int64_t* out, int64_t n, int64_t step, cudaStream_t stream);
// Copies a column range: dst[r, 0 … cols) ← src[r, 0 … cols) for r < rows, both with their own
// row strides (in elements of 2 bytes).
void copy_cols_bf16(const __nv_bfloat16* src, int64_t ld_src, int64_t rows, int64_t cols,
                    __nv_bfloat16* dst, int64_t ld_dst, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
