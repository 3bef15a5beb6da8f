// How an fp8 e4m3 weight [rows, cols] is scaled, and how many fp32 scales that takes (docs/fp8.md):
// one per 128×128 tile (the dense linears as the release ships them), or one per row and 128
// columns (the routed experts). CPU code: the byte counts (model/weight_bytes.h) and the CUDA
// kernels (ops/cuda/fp8.h) share it.
#pragma once

#include <cstdint>

namespace cpfill::ops {

// Tile128: scales [ceil(rows/128)][round_up(ceil(cols/128), 4)] (padding columns hold 1: cuBLASLt
// reads rows of a multiple of 4). Row128: scales [cols/128][rows] (rows fastest; cols a multiple
// of 128).
enum class Fp8Blocks { Tile128, Row128 };

inline int64_t fp8_scale_count(int64_t rows, int64_t cols, Fp8Blocks blocks) {
    const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    if (blocks == Fp8Blocks::Tile128)
        return ceil_div(rows, 128) * (ceil_div(ceil_div(cols, 128), 4) * 4);
    return rows * (cols / 128);
}

}  // namespace cpfill::ops
