// Interleaved partial RoPE on the GPU (docs/architecture.md §3.0): bf16 in place, fp32 math, the
// angle fp32(inv_freq) · fp32(position) as on the CPU backend (ops/rope.h builds inv_freq).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// x: rows of stride ld; the last rope_dim channels of each of `heads` blocks of head_dim rotate.
// inv_freq: device fp32 [rope_dim / 2]; pos: device int64 [rows]; inverse: rotate by −pos.
void apply_rope(__nv_bfloat16* x, int64_t rows, int64_t ld, int heads, int head_dim, int rope_dim,
                const float* inv_freq, const int64_t* pos, bool inverse, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
