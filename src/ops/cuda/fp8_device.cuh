// Device helpers of the fp8 kernels (ops/cuda/fp8.cu, moe_fp8.cu): e4m3 conversion, warp maxima and
// the activation quantisation of one (token, 128 channels) block by one warp.
#pragma once

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

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The 128 values of a block, 4 per lane (v: this lane's), quantised with the block's scale
// amax / 448 (1 when all are 0): the lane's 4 e4m3 bytes go to q (4-byte aligned); returns the
// scale (the same in every lane).
__device__ inline float quantize_block128(const float v[4], uint8_t* q) {
    float amax = 0.0f;
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
    amax = warp_max(amax);
    const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    uchar4 out;
    out.x = to_e4m3(v[0] / s);
    out.y = to_e4m3(v[1] / s);
    out.z = to_e4m3(v[2] / s);
    out.w = to_e4m3(v[3] / s);
    *reinterpret_cast<uchar4*>(q) = out;
    return s;
}

}  // namespace cpfill::ops::cuda::fp8_device
