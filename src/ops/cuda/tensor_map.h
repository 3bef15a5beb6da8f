// TMA tensor maps (the descriptors of cp.async.bulk.tensor) for the Hopper kernels that read tiles
// of e4m3 or bf16 rows (grouped_fp8.cu, indexer_hopper.cu) or write bf16 tiles (grouped_fp8.cu).
// The driver's cuTensorMapEncodeTiled is looked up once through the runtime, so nothing links
// libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// The driver's encoder; throws when the driver has none (older than CUDA 12).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A row-major byte matrix [rows, cols] (e4m3) read in boxes of box_rows × 128 bytes in the
// 128-byte swizzle, zeros past the last row. `what` names the caller in a refusal.
CUtensorMap e4m3_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                          const char* what);

// A row-major byte tensor [d2, d1, d0] read in boxes of box2 × box1 × 128 bytes in the 128-byte
// swizzle (shared-memory rows of 128 bytes, d1 fastest), zeros past every bound: a box may pad d0
// to 128 bytes and d1 to box1. d0 a multiple of 16. `what` names the caller in a refusal.
CUtensorMap byte_tile_map_3d(const void* base, int64_t d0, int64_t d1, int64_t d2, int box1,
                             int box2, const char* what);

}  // namespace cpfill::ops::cuda
