// Routed experts kept in the release's fp4 (docs/fp8.md, "fp4 experts"): e2m1 values packed two per
// byte (column 2j in the low nibble) with one E8M0 scale byte (2^(s − 127)) per row and 32
// columns, as the release ships them. The GEMMs read fp8: before a layer's expert GEMMs its
// experts are re-encoded on the device into e4m3 with 128×128 tile scales (fp4_to_fp8_tiles), so
// the GPU holds half a byte per weight and one layer's experts in fp8 at a time.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// w f32 [rows, cols] → q [rows, cols / 2] packed e2m1 and s [rows, cols / 32] E8M0, each block's
// scale the least power of two with amax / scale ≤ 6 (values of the form e2m1 · 2^k come back
// exactly); values that do not are rounded to the nearest e2m1 and counted in *inexact (device
// counter, may be null). cols a multiple of 32.
void quantize_weight_fp4(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* s,
                         unsigned long long* inexact, cudaStream_t stream);

// `count` fp4 matrices [rows, cols] (one after the other, as quantize_weight_fp4 lays them out) →
// e4m3 [count][rows, cols] with Tile128 scales (ops/fp8_blocks.h; fp8_scale_count per matrix):
// each tile's scale 2^(kmax − 6) for its largest block exponent kmax, so every value is e2m1 ·
// 2^(k − kmax + 6) ≤ 384 in e4m3 — exact unless a block sits more than 2^14 below the tile's
// largest (its smallest values underflow), which is counted in *inexact (may be null).
// tile_k: int scratch of fp4_tile_scratch(count, rows, cols) values (the tiles' exponents).
void fp4_to_fp8_tiles(const uint8_t* q, const uint8_t* s, int64_t count, int64_t rows, int64_t cols,
                      uint8_t* q8, float* scale, int* tile_k, unsigned long long* inexact,
                      cudaStream_t stream);
inline int64_t fp4_tile_scratch(int64_t count, int64_t rows, int64_t cols) {
    return count * ((rows + 127) / 128) * ((cols + 127) / 128);
}

}  // namespace cpfill::ops::cuda
