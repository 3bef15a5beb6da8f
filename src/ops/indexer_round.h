// The lightning indexer's queries and keys rounded as a low-precision GPU kernel would read them,
// on the CPU backend, for a numerics study (docs/fp8.md, "The indexer's queries and keys rounded"):
// does the indexer keep its top-k selections when q_I and K_I are not fp32? Two formats:
//   Fp8: e4m3 per (row, 128 channels), scale amax / 448 (round_fp8_blocks, as the fp8 activations);
//   Fp4Hadamard: the release's reference (docs/architecture.md §6.4, 3): rotate each 128 channels
//     by the orthonormal Walsh–Hadamard matrix (Sylvester order, H / sqrt(128)), then e2m1 in
//     blocks of 32 with the power-of-two scale 2^ceil(log2(amax / 6)), amax floored at 6·2^−126.
//     The rotated values are kept: q and k rotate alike, so q · k changes only by the rounding.
#pragma once

#include <cstdint>

namespace cpfill::ops {

enum class IndexerRounding { None, Fp8, Fp4Hadamard };

// "none", "fp8" or "fp4-hadamard".
const char* indexer_rounding_name(IndexerRounding r);

// x[128] ← H x with H the orthonormal Sylvester Hadamard matrix of size 128 (its own inverse).
void hadamard128(float* x);

// x[k] rounded in place to e2m1 in blocks of 32 with the power-of-two scale above; k a multiple of
// 32.
void round_e2m1_blocks32(float* x, int64_t k);

// Rows x[n, k] (contiguous; k a multiple of 128: each indexer head's d_I channels, or one key)
// rounded in place as `r` says; None leaves them.
void round_indexer_rows(IndexerRounding r, float* x, int64_t n, int64_t k);

}  // namespace cpfill::ops
