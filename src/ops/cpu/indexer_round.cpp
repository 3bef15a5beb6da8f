// The indexer's rounding for the CPU study (ops/indexer_round.h).
#include "ops/indexer_round.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/act_rounding.h"

namespace cpfill::ops {

const char* indexer_rounding_name(IndexerRounding r) {
    switch (r) {
        case IndexerRounding::None:
            return "none";
        case IndexerRounding::Fp8:
            return "fp8";
        case IndexerRounding::Fp4Hadamard:
            return "fp4-hadamard";
    }
    return "?";
}

void hadamard128(float* x) {
    // The fast Walsh–Hadamard butterflies give the Sylvester order (H[i][j] = (−1)^popcount(i &
    // j)); 1 / sqrt(128) makes it orthonormal.
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = 1.0f / std::sqrt(128.0f);
    for (int i = 0; i < 128; ++i) x[i] *= s;
}

void round_e2m1_blocks32(float* x, int64_t k) {
    CPFILL_CHECK(k % 32 == 0, "fp4 indexer rounding: {} channels; expected a multiple of 32", k);
    for (int64_t b = 0; b < k; b += 32) {
        float* v = x + b;
        float amax = 6.0f * std::ldexp(1.0f, -126);  // the reference's floor: an all-zero block
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
        // scale = 2^ceil(log2(amax / 6)), exactly: amax / 6 = m · 2^e with m in [0.5, 1), whose
        // log2 is e − 1 when m is 0.5 (a power of two) and rounds up to e otherwise.
        int e = 0;
        const float m = std::frexp(amax / 6.0f, &e);
        const float scale = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
        for (int j = 0; j < 32; ++j) v[j] = e2m1_to_f32(f32_to_e2m1(v[j] / scale)) * scale;
    }
}

void round_indexer_rows(IndexerRounding r, float* x, int64_t n, int64_t k) {
    if (r == IndexerRounding::None) return;
    CPFILL_CHECK(k % 128 == 0,
                 "indexer rounding ({}): {} channels a row; expected a multiple of 128 (d_I)",
                 indexer_rounding_name(r), k);
    if (r == IndexerRounding::Fp8) {
        // round_fp8_blocks reads and writes contiguous rows, so in place is safe (each block is
        // read whole before it is written).
        round_fp8_blocks(x, n, k, k, x);
        return;
    }
    for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < k; b += 128) {
            hadamard128(x + t * k + b);
            round_e2m1_blocks32(x + t * k + b, 128);
        }
}

}  // namespace cpfill::ops
