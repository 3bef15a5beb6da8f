// fp4 e2m1 packing and the re-encoding to e4m3 tiles. quantize: one warp per (row, 32 columns),
// one value per lane; re-encoding: one block of 256 threads per 128×128 tile.
#include "core/error.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/fp8_device.cuh"
#include "ops/fp8_blocks.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using fp8_device::from_e4m3;
using fp8_device::to_e4m3;
using fp8_device::warp_max;

constexpr float kE2m1Max = 6.0f;

__device__ inline float e2m1_value(uint8_t code) {  // code: sign bit 3, magnitude bits 0–2
    constexpr float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[code & 7];
    return code & 8 ? -v : v;
}

__device__ inline uint8_t e2m1_code(float x) {  // nearest, saturating at 6
    const float a = fabsf(x);
    const uint8_t m = a < 0.25f   ? 0
                      : a < 0.75f ? 1
                      : a < 1.25f ? 2
                      : a < 1.75f ? 3
                      : a < 2.5f  ? 4
                      : a < 3.5f  ? 5
                      : a < 5.0f  ? 6
                                  : 7;
    return static_cast<uint8_t>(m | (x < 0.0f && m ? 8 : 0));
}

__global__ void quant_fp4_kernel(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* s,
                                 unsigned long long* inexact) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t nb = cols / 32;
    if (warp >= rows * nb) return;
    const int64_t r = warp / nb, b = warp % nb;
    const float v = w[r * cols + b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    // The least power of two p = 2^k with amax / p ≤ 6 (k = 0 for an all-zero block).
    int k = 0;
    if (amax > 0.0f && isfinite(amax)) {
        k = static_cast<int>(ceilf(log2f(amax / kE2m1Max)));
        while (amax / exp2f(static_cast<float>(k)) > kE2m1Max) ++k;
        while (k > -127 && amax / exp2f(static_cast<float>(k - 1)) <= kE2m1Max) --k;
    }
    k = max(-127, min(127, k));
    const float p = exp2f(static_cast<float>(k));
    const uint8_t code = e2m1_code(v / p);
    const unsigned bad = e2m1_value(code) * p != v;
    const uint8_t other = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, code, 1));
    if (lane % 2 == 0)
        q[r * (cols / 2) + b * 16 + lane / 2] = static_cast<uint8_t>(code | other << 4);
    if (lane == 0) s[r * nb + b] = static_cast<uint8_t>(k + 127);
    const unsigned n_bad = __popc(__ballot_sync(0xffffffffu, bad));
    if (inexact && lane == 0 && n_bad) atomicAdd(inexact, static_cast<unsigned long long>(n_bad));
}

// Pass 1, one warp per 128×128 tile (over all matrices): the tile's largest block exponent →
// its scale 2^(kmax − 127 − 6) into the Tile128 scales (and the padding columns' 1s), and the
// exponent into tile_k for pass 2.
__global__ void tile_scale_kernel(const uint8_t* s, int64_t count, int64_t rows, int64_t cols,
                                  int64_t kb, int64_t rt, int64_t ld, int64_t scales_per,
                                  float* scale, int* tile_k) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= count * rt * ld) return;
    const int64_t mat = warp / (rt * ld), t = warp % (rt * ld), tr = t / ld, tc = t % ld;
    float* sc = scale + mat * scales_per + tr * ld + tc;
    if (tc >= kb) {  // a padding column
        if (lane == 0) *sc = 1.0f;
        return;
    }
    const int64_t nb = cols / 32;
    const uint8_t* sm = s + mat * rows * nb;
    int kmax = -1;
    for (int i = lane; i < 128 * 4; i += 32) {
        const int64_t r = tr * 128 + i / 4, b = tc * 4 + i % 4;
        if (r < rows && b < nb) kmax = max(kmax, int{sm[r * nb + b]});
    }
    for (int o = 16; o > 0; o /= 2) kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o));
    if (kmax < 0) kmax = 127;
    const int ks = kmax - 127 - 6;
    if (lane == 0) {
        *sc = exp2f(static_cast<float>(ks));
        tile_k[(mat * rt + tr) * kb + tc] = ks;
    }
}

// Pass 2, one thread per (row, 32 columns): 16 packed bytes in, 32 e4m3 bytes out, through a
// 16-entry table of e2m1 code → e4m3 byte for this block's exponent offset.
__global__ void fp4_to_fp8_kernel(const uint8_t* q, const uint8_t* s, int64_t count, int64_t rows,
                                  int64_t cols, int64_t kb, int64_t rt, const int* tile_k,
                                  uint8_t* q8, unsigned long long* inexact) {
    const int64_t nb = cols / 32;
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= count * rows * nb) return;
    const int64_t mat = i / (rows * nb), rb = i % (rows * nb), r = rb / nb, b = rb % nb;
    const int k = int{s[i]} - 127;
    const int d = k - tile_k[(mat * rt + r / 128) * kb + (b * 32) / 128];
    const float f = exp2f(static_cast<float>(d));
    uint8_t table[16];
    unsigned bad = 0;
    for (int c = 0; c < 16; ++c) {
        const float v = e2m1_value(static_cast<uint8_t>(c)) * f;
        table[c] = to_e4m3(v);
        bad |= (from_e4m3(table[c]) != v) << c;
    }
    const uint4 in =
        *reinterpret_cast<const uint4*>(q + mat * rows * (cols / 2) + r * (cols / 2) + b * 16);
    const uint32_t words[4] = {in.x, in.y, in.z, in.w};
    uint32_t out[8];
    unsigned long long n_bad = 0;
    for (int w = 0; w < 4; ++w)
        for (int h = 0; h < 2; ++h) {  // 4 bytes of input → 8 values → 2 output words
            uint32_t o = 0;
            for (int j = 0; j < 4; ++j) {
                const uint32_t code = (words[w] >> (8 * (2 * h + j / 2) + 4 * (j % 2))) & 15;
                o |= uint32_t{table[code]} << (8 * j);
                n_bad += (bad >> code) & 1;
            }
            out[w * 2 + h] = o;
        }
    uint4* dst = reinterpret_cast<uint4*>(q8 + mat * rows * cols + r * cols + b * 32);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    if (inexact && n_bad) atomicAdd(inexact, n_bad);
}

}  // namespace

void quantize_weight_fp4(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* s,
                         unsigned long long* inexact, cudaStream_t stream) {
    CPFILL_CHECK(cols % 32 == 0, "fp4 weights: {} columns is not a multiple of 32", cols);
    if (rows == 0 || cols == 0) return;
    const int64_t threads = rows * (cols / 32) * 32;
    quant_fp4_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
        w, rows, cols, q, s, inexact);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void fp4_to_fp8_tiles(const uint8_t* q, const uint8_t* s, int64_t count, int64_t rows, int64_t cols,
                      uint8_t* q8, float* scale, int* tile_k, unsigned long long* inexact,
                      cudaStream_t stream) {
    CPFILL_CHECK(cols % 32 == 0, "fp4 weights: {} columns is not a multiple of 32", cols);
    if (count == 0 || rows == 0 || cols == 0) return;
    const int64_t kb = (cols + 127) / 128, ld = (kb + 3) / 4 * 4, rt = (rows + 127) / 128;
    const int64_t tiles = count * rt * ld, blocks = count * rows * (cols / 32);
    tile_scale_kernel<<<static_cast<unsigned>((tiles * 32 + 255) / 256), 256, 0, stream>>>(
        s, count, rows, cols, kb, rt, ld, fp8_scale_count(rows, cols, Fp8Blocks::Tile128), scale,
        tile_k);
    CPFILL_CUDA_CHECK(cudaGetLastError());
    fp4_to_fp8_kernel<<<static_cast<unsigned>((blocks + 255) / 256), 256, 0, stream>>>(
        q, s, count, rows, cols, kb, rt, tile_k, q8, inexact);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
