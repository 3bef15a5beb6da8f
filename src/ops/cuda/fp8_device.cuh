// Device helpers of the fp8 kernels (ops/cuda/fp8.cu, moe_fp8.cu): e4m3 conversion, warp maxima and
// the activation quantisation of rows by one warp each, one 128-channel block per half-warp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace cpfill::ops::cuda::fp8_device {

constexpr float kE4m3Max = 448.0f;

__device__ inline uint8_t to_e4m3(float v) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ inline float from_e4m3(uint8_t q) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
    return __half2float(__half(h));
}

// The scale of a block whose largest magnitude is amax: amax / 448, or 1 when all are 0 (the CPU's
// round_fp8_blocks, ops/act_rounding.h).
__device__ inline float e4m3_scale(float amax) { return amax > 0.0f ? amax / kE4m3Max : 1.0f; }

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Row quantisation. Lane l of a warp holds channels 8·(l % 16) … + 7 of a 128-block, half-warp
// l / 16 its own block: one 16-byte bf16 load and one 8-byte e4m3 store per lane and block. kVec
// false reads and writes the same values with 2-byte loads and byte stores, for rows the launcher
// finds unaligned (rows_vectorisable).
constexpr int kRowLoads = 4;  // 16-byte loads in flight per lane and source: 8 blocks per step

// Whether bf16 rows at x with stride ldx (elements) and e4m3 rows at q (stride a multiple of 128)
// take the kVec path.
inline bool rows_vectorisable(const void* x, int64_t ldx, const void* q) {
    return ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(q) % 8 == 0;
}

template <bool kVec>
__device__ inline uint4 load_bf16x8(const __nv_bfloat16* p) {
    if constexpr (kVec) {
        return *reinterpret_cast<const uint4*>(p);
    } else {
        uint32_t w[4];
        for (int j = 0; j < 4; ++j)
            w[j] = __nv_bfloat16_raw(p[2 * j]).x | uint32_t{__nv_bfloat16_raw(p[2 * j + 1]).x}
                                                       << 16;
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// The 8 bf16 of r (first lowest) as floats; exact, a bf16 is the top half of an fp32.
__device__ inline void bf16x8_to_float(uint4 r, float v[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    for (int j = 0; j < 4; ++j) {
        v[2 * j] = __uint_as_float(w[j] << 16);
        v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

// Half-warp h's block kb (v: this lane's 8 values) quantised with the block's scale amax / 448 (1
// when all are 0), each v / s rounded by cvt.rn.satfinite.e4m3x2 (what to_e4m3 does per value):
// the lane's bytes go to q + kb·128 + 8·(lane % 16), the scale to scale[kb · scale_stride]. Blocks
// kb ≥ kb_n (a step's tail) only take part in the shuffles, which need every lane.
template <bool kVec>
__device__ inline void quantize_block(const float v[8], int64_t kb, int64_t kb_n, uint8_t* q,
                                      float* scale, int64_t scale_stride) {
    float amax = 0.0f;
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    for (int o = 8; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (kb >= kb_n) return;
    const float s = e4m3_scale(amax);
    uint32_t w[4];
    for (int j = 0; j < 4; ++j)
        w[j] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * j] / s, v[2 * j + 1] / s), __NV_SATFINITE,
                                        __NV_E4M3);
    const int lane = threadIdx.x % 32;
    uint8_t* dst = q + kb * 128 + lane % 16 * 8;
    if constexpr (kVec) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
    } else {
        for (int j = 0; j < 8; ++j) dst[j] = static_cast<uint8_t>(w[j / 2] >> (8 * (j % 2)));
    }
    if (lane % 16 == 0) scale[kb * scale_stride] = s;
}

// One warp quantises a row of kb_n 128-blocks: src bf16 [kb_n · 128] (null: a pad row, zeros with
// scale 1) → q e4m3 [kb_n · 128], block kb's scale at scale[kb · scale_stride]. Each step issues
// the loads of 8 blocks (half-warp h: kb0 + 2u + h) before quantising any.
template <bool kVec>
__device__ void quantize_row128(const __nv_bfloat16* src, int64_t kb_n, uint8_t* q, float* scale,
                                int64_t scale_stride) {
    const int h = threadIdx.x % 32 / 16, c = threadIdx.x % 16 * 8;
    for (int64_t kb0 = 0; kb0 < kb_n; kb0 += 2 * kRowLoads) {
        uint4 raw[kRowLoads];
#pragma unroll
        for (int u = 0; u < kRowLoads; ++u) {
            const int64_t kb = kb0 + 2 * u + h;
            raw[u] = src && kb < kb_n ? load_bf16x8<kVec>(src + kb * 128 + c) : uint4{};
        }
#pragma unroll
        for (int u = 0; u < kRowLoads; ++u) {
            float v[8];
            bf16x8_to_float(raw[u], v);
            quantize_block<kVec>(v, kb0 + 2 * u + h, kb_n, q, scale, scale_stride);
        }
    }
}

}  // namespace cpfill::ops::cuda::fp8_device
