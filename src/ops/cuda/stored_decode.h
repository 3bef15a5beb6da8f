// A checkpoint's stored weight bytes (io/checkpoint.h StoredSlab: f32 / bf16 / f16, fp8 e4m3 with
// 128×128 block scales, packed fp4 e2m1 with 1×32 scales; scales E8M0 or F32 powers of two)
// decoded to f32 on the GPU, with the same values as the host's decoders (core/dtype's
// conversions, tabulated), so that the GPU upload can copy stored bytes instead of fp32
// (docs/loading.md, "GPU upload from stored bytes").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// A staged part of a slab on the device: its weight bytes are rows from slab row w_row0, each
// starting at slab column w_col0 (even for fp4) and w_pitch bytes apart; its scales (fp8 / fp4)
// are rows from scale row s_row0, each from scale column s_col0, s_pitch bytes apart, and the
// scale of slab element (r, c) is scale[(r + s_row_off) / row_block][c / col_block].
struct StagedSlab {
    enum Kind : int { F32 = 0, BF16 = 1, F16 = 2, Fp8 = 3, Fp4 = 4 };
    Kind kind = F32;
    const uint8_t* w = nullptr;
    int64_t w_pitch = 0, w_row0 = 0, w_col0 = 0;
    const uint8_t* s = nullptr;
    bool s_f32 = false;  // scales stored as F32 (else E8M0 bytes)
    int64_t s_pitch = 0, s_row0 = 0, s_col0 = 0, s_row_off = 0, row_block = 1, col_block = 1;
};

// Bad elements are recorded in `*bad` (device memory, set to UINT64_MAX by reset_bad): the least
// linear slab index r · cols + c of an element whose value is not finite or whose F32 scale is
// not a power of two 2^k (k in [−127, 127]). The caller reads that element on the host
// (Checkpoint::read_f32_block), which gives the host loader's error for it.
void reset_bad(unsigned long long* bad, cudaStream_t stream);

// dst[(r − r0) · ld + (c − c0)] = slab element (r, c) for r in [r0, r1), c in [c0, c1), from
// `src`, a slab of `cols` columns. Bad elements' dst values are whatever the arithmetic gave.
void decode_stored(const StagedSlab& src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   int64_t cols, float* dst, int64_t ld, unsigned long long* bad,
                   cudaStream_t stream);

// Records the least index i of a non-finite element of n f32 or bf16 values in *bad (for
// copies made without decoding: i = r · cols + c of the whole weight).
void check_finite(const void* data, bool bf16, int64_t n, unsigned long long* bad,
                  cudaStream_t stream);

// dst[i] = bf16(src[i]) rounded to nearest even, i < n.
void f32_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream);

}  // namespace cpfill::ops::cuda
