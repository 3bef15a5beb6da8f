// Decoders of stored weight bytes (stored_decode.h): one thread per element, memory-bound. The
// element conversions restate core/dtype's exactly: e4m3 and E8M0 built from their bits (both are
// exact in f32), e2m1 from its eight magnitudes; value × scale is one f32 product, as on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "ops/cuda/stored_decode.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

__device__ inline float e4m3_value(uint8_t v) {
    const int exp = (v >> 3) & 0xf, mant = v & 0x7;
    float a;
    if (exp == 0xf && mant == 0x7)
        a = __int_as_float(0x7fc00000);
    else if (exp == 0)
        a = static_cast<float>(mant) * 0.001953125f;  // mant · 2^−9
    else
        a = __int_as_float(((exp + 120) << 23) | (mant << 20));  // (1 + mant/8) · 2^(exp − 7)
    return (v & 0x80) ? -a : a;
}

__device__ inline float e8m0_value(uint8_t v) {
    if (v == 0xff) return __int_as_float(0x7fc00000);
    return __int_as_float(v == 0 ? 0x00400000 : static_cast<int>(v) << 23);  // 2^(v − 127)
}

__device__ inline float e2m1_value(uint8_t nibble) {
    constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float m = kMag[nibble & 0x7];
    return (nibble & 0x8) ? -m : m;
}

// An F32 scale is usable when it is 2^k, k in [−127, 127]: what the host's frexp check accepts;
// another makes the element NaN, so that it is reported as bad.
__device__ inline bool power_of_two(float v) {
    const unsigned b = __float_as_uint(v);
    const unsigned e = (b >> 23) & 0xff;
    return b == 0x00400000u || ((b & 0x807fffffu) == 0 && e >= 1 && e <= 254);
}

__global__ void decode_kernel(StagedSlab src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                              int64_t cols, float* dst, int64_t ld, unsigned long long* bad) {
    const int64_t width = c1 - c0, n = (r1 - r0) * width;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = r0 + i / width, c = c0 + i % width;
        const uint8_t* row = src.w + (r - src.w_row0) * src.w_pitch;
        float v;
        switch (src.kind) {
            case StagedSlab::F32:
                v = reinterpret_cast<const float*>(row)[c - src.w_col0];
                break;
            case StagedSlab::BF16:
                v = __uint_as_float(
                    static_cast<unsigned>(reinterpret_cast<const uint16_t*>(row)[c - src.w_col0])
                    << 16);
                break;
            case StagedSlab::F16:
                v = __half2float(reinterpret_cast<const __half*>(row)[c - src.w_col0]);
                break;
            default: {
                const bool fp4 = src.kind == StagedSlab::Fp4;
                const uint8_t byte = fp4 ? row[(c - src.w_col0) >> 1] : row[c - src.w_col0];
                const float q =
                    fp4 ? e2m1_value((c & 1) ? byte >> 4 : byte & 0xf) : e4m3_value(byte);
                const int64_t sr = (r + src.s_row_off) / src.row_block, sc = c / src.col_block;
                const uint8_t* sp = src.s + (sr - src.s_row0) * src.s_pitch;
                float scale;
                if (src.s_f32) {
                    scale = reinterpret_cast<const float*>(sp)[sc - src.s_col0];
                    if (!power_of_two(scale)) scale = __int_as_float(0x7fc00000);  // reported
                } else {
                    scale = e8m0_value(sp[sc - src.s_col0]);
                }
                v = q * scale;
            }
        }
        if (!isfinite(v)) atomicMin(bad, static_cast<unsigned long long>(r * cols + c));
        dst[(r - r0) * ld + (c - c0)] = v;
    }
}

__global__ void check_kernel(const void* data, bool bf16, int64_t n, unsigned long long* bad) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i])
                             : static_cast<const float*>(data)[i];
        if (!isfinite(v)) atomicMin(bad, static_cast<unsigned long long>(i));
    }
}

__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + 255) / 256, 1, 16384)); }

}  // namespace

void reset_bad(unsigned long long* bad, cudaStream_t stream) {
    CPFILL_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(*bad), stream));
}

void decode_stored(const StagedSlab& src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   int64_t cols, float* dst, int64_t ld, unsigned long long* bad,
                   cudaStream_t stream) {
    const int64_t n = (r1 - r0) * (c1 - c0);
    if (n <= 0) return;
    decode_kernel<<<grid_for(n), 256, 0, stream>>>(src, r0, r1, c0, c1, cols, dst, ld, bad);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void check_finite(const void* data, bool bf16, int64_t n, unsigned long long* bad,
                  cudaStream_t stream) {
    if (n <= 0) return;
    check_kernel<<<grid_for(n), 256, 0, stream>>>(data, bf16, n, bad);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void f32_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
