// fp8 quantisation kernels. Weight blocks: one thread block of 256 per 128×128 tile (Tile128) or
// one warp per (row, 128 columns) (Row128); activations: one warp per token, 8 channels per lane
// (fp8_device::quantize_row128). Scales are powers of two for weights (exact round trips),
// amax / 448 for activations.
#include <cuda_fp8.h>

#include "core/error.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The least power of two p with amax / p ≤ 448 (1 when amax is 0 or not finite).
__device__ float pow2_scale(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    const float s = amax / kFp8Max;
    uint32_t bits = __float_as_uint(s);
    if (bits & 0x007FFFFFu) bits = (bits & 0xFF800000u) + 0x00800000u;  // round up to 2^k
    float p = __uint_as_float(bits);
    while (amax / p > kFp8Max) p *= 2.0f;  // s rounded down in the division: one more step
    return p;
}

using fp8_device::from_e4m3;
using fp8_device::to_e4m3;
using fp8_device::warp_max;

// One block of 256 threads per 128×128 tile (blockIdx.x: column tile, blockIdx.y: row tile).
__global__ void quant_tile_kernel(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                  float* scale, int64_t scale_ld, unsigned long long* inexact) {
    const int64_t r0 = int64_t{blockIdx.y} * 128, c0 = int64_t{blockIdx.x} * 128;
    __shared__ float red[8];
    float amax = 0.0f;
    for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
        const int64_t r = r0 + i / 128, c = c0 + i % 128;
        if (r < rows && c < cols) amax = fmaxf(amax, fabsf(w[r * cols + c]));
    }
    amax = warp_max(amax);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    float m = 0.0f;
    for (int i = 0; i < 8; ++i) m = fmaxf(m, red[i]);
    const float p = pow2_scale(m);
    unsigned long long bad = 0;
    for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
        const int64_t r = r0 + i / 128, c = c0 + i % 128;
        if (r >= rows || c >= cols) continue;
        const float v = w[r * cols + c];
        const uint8_t e = to_e4m3(v / p);
        q[r * cols + c] = e;
        bad += from_e4m3(e) * p != v;
    }
    if (threadIdx.x == 0) scale[blockIdx.y * scale_ld + blockIdx.x] = p;
    if (inexact && bad) atomicAdd(inexact, bad);
}

// Padding columns of the Tile128 scales (cuBLASLt reads [.][round_up(., 4)]): 1.
__global__ void fill_kernel(float* p, int64_t rows, int64_t ld, int64_t used) {
    const int64_t r = blockIdx.x;
    for (int64_t c = used + threadIdx.x; c < ld; c += blockDim.x) p[r * ld + c] = 1.0f;
}

// One warp per (row, 128 columns): 4 values per lane.
__global__ void quant_row_kernel(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                 float* scale, unsigned long long* inexact) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t kb_n = cols / 128;
    if (warp >= rows * kb_n) return;
    const int64_t r = warp / kb_n, kb = warp % kb_n;
    const float* src = w + r * cols + kb * 128 + lane * 4;
    float v[4], amax = 0.0f;
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j] = src[j]));
    const float p = pow2_scale(warp_max(amax));
    unsigned long long bad = 0;
    uint8_t* dst = q + r * cols + kb * 128 + lane * 4;
    for (int j = 0; j < 4; ++j) {
        dst[j] = to_e4m3(v[j] / p);
        bad += from_e4m3(dst[j]) * p != v[j];
    }
    if (lane == 0) scale[kb * rows + r] = p;
    for (int o = 16; o > 0; o /= 2) bad += __shfl_xor_sync(0xffffffffu, bad, o);
    if (inexact && lane == 0 && bad) atomicAdd(inexact, bad);
}

// One warp per token t < n_pad (fp8_device::quantize_row128); rows from n on are pad rows.
template <bool kVec>
__global__ void quant_act_kernel(const bf16* x, int64_t ldx, int64_t n, int64_t n_pad, int64_t K,
                                 uint8_t* q, float* scale) {
    const int64_t t = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    if (t >= n_pad) return;
    fp8_device::quantize_row128<kVec>(t < n ? x + t * ldx : nullptr, K / 128, q + t * K, scale + t,
                                      n_pad);
}

__global__ void dequant_kernel(const uint8_t* q, const float* scale, int64_t rows, int64_t cols,
                               bool tile, int64_t scale_ld, float* out) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        const float p = tile ? scale[(r / 128) * scale_ld + c / 128] : scale[(c / 128) * rows + r];
        out[i] = from_e4m3(q[i]) * p;
    }
}

int blocks_for(int64_t threads) {
    return static_cast<int>(std::min<int64_t>(ceil_div(threads, 256), int64_t{1} << 30));
}

}  // namespace

int64_t fp8_weight_scales(int64_t rows, int64_t cols, Fp8Blocks blocks) {
    CPFILL_CHECK(blocks == Fp8Blocks::Tile128 || cols % 128 == 0,
                 "fp8 row blocks: {} columns is not a multiple of 128", cols);
    return fp8_scale_count(rows, cols, blocks);
}

void quantize_weight_fp8(const float* w, int64_t rows, int64_t cols, Fp8Blocks blocks, void* q,
                         float* scale, unsigned long long* inexact, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    auto* q8 = static_cast<uint8_t*>(q);
    if (blocks == Fp8Blocks::Tile128) {
        const int64_t kb = ceil_div(cols, 128), ld = ceil_div(kb, 4) * 4;
        CPFILL_CHECK(ceil_div(rows, 128) < 65536, "fp8 tiles: {} rows is too many", rows);
        const dim3 grid(static_cast<unsigned>(kb), static_cast<unsigned>(ceil_div(rows, 128)));
        quant_tile_kernel<<<grid, 256, 0, stream>>>(w, rows, cols, q8, scale, ld, inexact);
        if (ld > kb)
            fill_kernel<<<static_cast<unsigned>(ceil_div(rows, 128)), 32, 0, stream>>>(
                scale, ceil_div(rows, 128), ld, kb);
    } else {
        CPFILL_CHECK(cols % 128 == 0, "fp8 row blocks: {} columns is not a multiple of 128", cols);
        quant_row_kernel<<<blocks_for(rows * (cols / 128) * 32), 256, 0, stream>>>(
            w, rows, cols, q8, scale, inexact);
    }
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void quantize_act_fp8(const bf16* x, int64_t ldx, int64_t n, int64_t K, void* q, float* scale,
                      cudaStream_t stream, int64_t n_pad) {
    CPFILL_CHECK(K % 128 == 0 && ldx >= K,
                 "quantize_act_fp8: K {} (ldx {}) must be a multiple of 128", K, ldx);
    if (n_pad < 0) n_pad = n;
    CPFILL_CHECK(n_pad >= n, "quantize_act_fp8: {} rows padded to {}", n, n_pad);
    if (n_pad == 0) return;
    auto* kernel =
        fp8_device::rows_vectorisable(x, ldx, q) ? quant_act_kernel<true> : quant_act_kernel<false>;
    kernel<<<blocks_for(n_pad * 32), 256, 0, stream>>>(x, ldx, n, n_pad, K,
                                                       static_cast<uint8_t*>(q), scale);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void dequantize_weight_fp8(const void* q, const float* scale, int64_t rows, int64_t cols,
                           Fp8Blocks blocks, float* out, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    const bool tile = blocks == Fp8Blocks::Tile128;
    const int64_t ld = tile ? ceil_div(ceil_div(cols, 128), 4) * 4 : 0;
    dequant_kernel<<<blocks_for(std::min<int64_t>(rows * cols, int64_t{1} << 24)), 256, 0,
                     stream>>>(static_cast<const uint8_t*>(q), scale, rows, cols, tile, ld, out);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
