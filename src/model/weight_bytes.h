// What each weight of the table (io/weight_specs.h) takes on one rank: its element count for a
// rank's expert slice, the dtype the CUDA backend holds it in, and the totals the memory checks,
// `inspect` and `bench` print. CPU code (no CUDA headers): the byte counts are known without a GPU,
// and they are the same sums the GPU upload makes (model/cuda/gpu_weights.cu walks the same table).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "io/weight_specs.h"
#include "model/weights.h"

namespace cpfill {

// Elements of `spec` a rank with expert slice `slice` holds: the whole tensor when it is
// replicated, slice_width(moe_dim, slice) of its moe_dim hidden units when it is an expert's.
int64_t rank_numel(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice);

// The dtype of `spec` on a GPU: bf16 for the GEMM matrices (is_gemm_weight), f32 for the small
// tensors (norms, mHC, sinks, position biases, router bias), int64 for tid2eid.
DType gpu_dtype(const WeightSpec& spec);

// The slice of the rank of `cp` that holds the most expert units (the memory checks size for it).
ExpertSlice widest_slice(int64_t moe_dim, int cp);

// Device bytes of rank `slice`'s weights: every weight of the table at gpu_dtype, plus the two
// RoPE frequency tables (f32 [rope_dim / 2] each).
size_t gpu_rank_weight_bytes(const ModelConfig& cfg, ExpertSlice slice);
// What each GPU of a CP group of `cp` must hold: the widest rank's weight bytes. Refuses a cp
// outside [1, moe_dim], naming the range.
size_t gpu_weight_bytes(const ModelConfig& cfg, int cp);

}  // namespace cpfill
