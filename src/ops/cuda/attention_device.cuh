// Device code shared by the two attention kernels of ops/cuda/attention.h (attention_tc.cu on
// mma.sync, attention_wg.cu on wgmma): the query's key list and the address of its key rows, the
// probabilities' exp2, the quad max, and the folded query prologue (per-head RMSNorm and RoPE of
// one head row, AttnArgs q_norm / rope_dim) with the RoPE angles of the output epilogue.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/rope_device.cuh"

namespace cpfill::ops::cuda::attention_device {

constexpr int kHeadDim = 512;
constexpr float kLog2e = 1.4426950408889634f;

// The query's key list: n_window window rows from row j0, then entries (sel[e] or e).
struct KeyList {
    const __nv_bfloat16* window;
    int64_t j0;  // a row of window (the first window position − window0)
    int64_t n_window;
    const __nv_bfloat16* entries;
    const int32_t* sel;
    int64_t n_keys;
};

// The key list of the query at position p (row t of entry_idx). Every thread of the block calls
// it: the CSA count is a block-wide __syncthreads_count over the row's non-negative values.
__device__ __forceinline__ KeyList key_list(int64_t p, int64_t t, const __nv_bfloat16* window,
                                            int64_t window0, int window_size,
                                            const __nv_bfloat16* entries, int64_t n_entries,
                                            int ratio, const int32_t* entry_idx,
                                            int64_t idx_stride) {
    KeyList kl;
    kl.window = window;
    const int64_t first = p - window_size + 1 > 0 ? p - window_size + 1 : 0;
    kl.j0 = first - window0;
    kl.n_window = p - first + 1;
    kl.entries = entries;
    kl.sel = entry_idx ? entry_idx + t * idx_stride : nullptr;
    int64_t n_ent = 0;
    if (kl.sel) {
        for (int64_t i0 = 0; i0 < idx_stride; i0 += blockDim.x)
            n_ent +=
                __syncthreads_count(i0 + threadIdx.x < idx_stride && kl.sel[i0 + threadIdx.x] >= 0);
    } else if (ratio > 0) {
        n_ent = (p + 1) / ratio < n_entries ? (p + 1) / ratio : n_entries;
    }
    kl.n_keys = kl.n_window + n_ent;
    return kl;
}

// Row of key `key` (< n_keys) of the list. A CSA entry's row comes from sel_tile[r] (the tile's
// entry_idx values staged in shared memory, r = key's place in its tile) or, when sel_tile is
// null, from kl.sel.
__device__ __forceinline__ const __nv_bfloat16* key_row(const KeyList& kl, int64_t key,
                                                        const int32_t* sel_tile, int r) {
    if (key < kl.n_window) return kl.window + (kl.j0 + key) * kHeadDim;
    const int64_t e = key - kl.n_window;
    const int64_t er = kl.sel ? (sel_tile ? sel_tile[r] : kl.sel[e]) : e;
    return kl.entries + er * kHeadDim;
}

// 2^x by the SFU (≤ 2 ulp; 2^−∞ = 0): the probabilities, which are rounded to bf16 anyway.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// The RoPE pair (c, c + 1) (c even) of a head row: cos and sin of its angle (rope_device::cos_sin),
// sin negated for the inverse; cos 1, sin 0 outside the rotated slice.
__device__ __forceinline__ void rope_cos_sin(int c, int rope_dim, const float* inv_freq, float pos,
                                             bool inverse, float& cs, float& sn) {
    cs = 1.0f;
    sn = 0.0f;
    if (c < kHeadDim - rope_dim) return;
    rope_device::cos_sin(inv_freq, (c - (kHeadDim - rope_dim)) / 2, pos, inverse, cs, sn);
}

// The angles of the query prologue for lane `lane`, which holds channels 8·lane … 8·lane + 7 (half
// 0) and 256 + 8·lane … (half 1) of every head row.
struct LaneRope {
    float cs[2][4], sn[2][4];
};

__device__ __forceinline__ LaneRope lane_rope(int lane, int rope_dim, const float* inv_freq,
                                              float pos) {
    LaneRope r;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 4; ++k)
            rope_cos_sin(h * kHeadDim / 2 + lane * 8 + 2 * k, rope_dim, inv_freq, pos, false,
                         r.cs[h][k], r.sn[h][k]);
    return r;
}

// Two floats rounded to bf16 (low, high) as one 32-bit word, and back.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// Per-head RMSNorm (no weight, when norm) and RoPE of kRows head rows of a warp, fp32, one
// rounding to bf16. v[j] holds lane l's 16 channels of row j as bf16 pairs: pairs 0–3 channels
// 8l …, pairs 4–7 channels 256 + 8l …; rotate(k, a, b) turns pair k, normalised, by its angle (or
// leaves it). The rows' sums and shuffles are issued together, so with kRows > 1 their latencies
// overlap. The kernels load and store the rows wherever their layouts put them.
template <int kRows, class Rotate>
__device__ __forceinline__ void norm_rope_rows(uint32_t (&v)[kRows][8], bool norm, float eps,
                                               const Rotate& rotate) {
    float ss[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
        ss[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float2 f = unpack_bf16x2(v[j][k]);
            ss[j] += f.x * f.x + f.y * f.y;
        }
    }
    if (norm)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < kRows; ++j) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], off);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
        const float f = norm ? rsqrtf(ss[j] / kHeadDim + eps) : 1.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float2 x = unpack_bf16x2(v[j][k]);
            float a = x.x * f, b = x.y * f;
            rotate(k, a, b);
            v[j][k] = bf16x2(a, b);
        }
    }
}

// One head row: lane l's 16 channels are the 16-byte chunks half0 (channels 8l …) and half1
// (256 + 8l …), in shared memory wherever the kernel's layout puts them.
__device__ __forceinline__ void norm_rope_row(uint4* half0, uint4* half1, bool norm, float eps,
                                              const LaneRope& rope) {
    uint4* halves[2] = {half0, half1};
    uint32_t v[1][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) *reinterpret_cast<uint4*>(&v[0][4 * h]) = *halves[h];
    norm_rope_rows<1>(v, norm, eps, [&](int k, float& a, float& b) {
        rope_device::rotate(a, b, rope.cs[k / 4][k % 4], rope.sn[k / 4][k % 4]);
    });
#pragma unroll
    for (int h = 0; h < 2; ++h) *halves[h] = *reinterpret_cast<const uint4*>(&v[0][4 * h]);
}

}  // namespace cpfill::ops::cuda::attention_device
