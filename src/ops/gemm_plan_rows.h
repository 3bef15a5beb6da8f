// The row classes of the GPU GEMM plans (ops/cuda/gemm.cu): GEMMs whose row counts fall in one
// class share one cuBLASLt plan, made the first time the class is seen (~0.2 ms of host time per
// heuristic call). The classes are n itself up to 64, then multiples of 16 up to 256, then
// quarter octaves (257–320, 321–384, …, 1281–1536, …). Plain arithmetic, so that code without
// CUDA (the engine's warm-up) can walk the classes too.
#pragma once

#include <cstdint>

namespace cpfill::ops {

// The largest row count of n's class (n ≥ 1): every class is named by its top.
inline int64_t gemm_plan_rows(int64_t n) {
    if (n <= 64) return n;
    if (n <= 256) return (n + 15) / 16 * 16;
    int64_t octave = 256;
    while (octave * 2 < n) octave *= 2;
    const int64_t step = octave / 4;
    return (n + step - 1) / step * step;
}

}  // namespace cpfill::ops
