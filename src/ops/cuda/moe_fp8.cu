// expert_offsets, gather_quant_fp8 and swiglu_quant_fp8(_experts): one warp per (row, 128
// channels).
#include "core/error.h"
#include "ops/cuda/fp8_device.cuh"
#include "ops/cuda/moe_fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

unsigned warp_blocks(int64_t warps) {  // 8 warps per block of 256
    return static_cast<unsigned>((warps + 7) / 8);
}

__global__ void offsets_kernel(const int32_t* counts, int E, int32_t* first, int32_t* pfirst) {
    if (threadIdx.x != 0) return;
    int32_t f = 0, pf = 0;
    for (int e = 0; e < E; ++e) {
        first[e] = f;
        pfirst[e] = pf;
        const int32_t c = counts[e];
        f += c;
        pf += (c + kExpertRowAlign - 1) / kExpertRowAlign * kExpertRowAlign;
    }
    first[E] = f;
    pfirst[E] = pf;
}

// The expert whose padded block holds row p: the largest e with pfirst[e] ≤ p (empty experts
// share their successor's offset, so the largest is the non-empty one).
__device__ int expert_of(const int32_t* pfirst, int E, int64_t p) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (pfirst[mid] <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ void gather_quant_kernel(const bf16* y, int64_t D, const int32_t* perm, int top_k,
                                    const float* weight, const int32_t* counts,
                                    const int32_t* first, const int32_t* pfirst, int E,
                                    int64_t n_pad, uint8_t* xq, float* xs, float* sp,
                                    int32_t* inv) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t kb_n = D / 128;
    if (warp >= n_pad * kb_n) return;
    const int64_t p = warp / kb_n, kb = warp % kb_n;
    const int e = expert_of(pfirst, E, p);
    const int64_t i = p - pfirst[e], m4 = pfirst[e + 1] - pfirst[e];
    const bool valid = i < counts[e];
    const int32_t a = valid ? perm[first[e] + i] : 0;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
        const bf16* src = y + int64_t{a / top_k} * D + kb * 128 + lane * 4;
        for (int j = 0; j < 4; ++j) v[j] = __bfloat162float(src[j]);
    }
    const float s = fp8_device::quantize_block128(v, xq + p * D + kb * 128 + lane * 4);
    if (lane != 0) return;
    xs[int64_t{pfirst[e]} * kb_n + kb * m4 + i] = s;
    if (kb != 0) return;
    sp[p] = valid ? weight[a] : 0.0f;
    if (valid) inv[a] = static_cast<int32_t>(p);
}

// One lane's 4 of a warp's 128 SwiGLU outputs (gate at g_row, up width further), quantised into q;
// returns the block's scale.
__device__ float swiglu_block(const bf16* g_row, int64_t width, float limit, float rs, uint8_t* q) {
    float v[4];
    for (int j = 0; j < 4; ++j) {
        float g = __bfloat162float(g_row[j]);
        float u = __bfloat162float(g_row[width + j]);
        if (limit > 0.0f) {
            g = fminf(g, limit);
            u = fminf(fmaxf(u, -limit), limit);
        }
        v[j] = g / (1.0f + expf(-g)) * u * rs;
    }
    return fp8_device::quantize_block128(v, q);
}

__global__ void swiglu_quant_kernel(const bf16* gu, int64_t m4, int64_t width, float limit,
                                    const float* row_scale, uint8_t* aq, float* as) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t kb_n = width / 128;
    if (warp >= m4 * kb_n) return;
    const int64_t r = warp / kb_n, kb = warp % kb_n;
    const float s =
        swiglu_block(gu + r * 2 * width + kb * 128 + lane * 4, width, limit,
                     row_scale ? row_scale[r] : 1.0f, aq + r * width + kb * 128 + lane * 4);
    if (lane == 0) as[kb * m4 + r] = s;
}

// swiglu_quant_kernel over the padded rows of all experts: row p of expert e (found in pfirst)
// writes its scales into that expert's [width/128][m4] block.
__global__ void swiglu_quant_experts_kernel(const bf16* gu, int64_t n_pad, int64_t width,
                                            float limit, const float* row_scale,
                                            const int32_t* pfirst, int E, uint8_t* aq, float* as) {
    const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t kb_n = width / 128;
    if (warp >= n_pad * kb_n) return;
    const int64_t p = warp / kb_n, kb = warp % kb_n;
    const int e = expert_of(pfirst, E, p);
    const int64_t i = p - pfirst[e], m4 = pfirst[e + 1] - pfirst[e];
    const float s = swiglu_block(gu + p * 2 * width + kb * 128 + lane * 4, width, limit,
                                 row_scale[p], aq + p * width + kb * 128 + lane * 4);
    if (lane == 0) as[int64_t{pfirst[e]} * kb_n + kb * m4 + i] = s;
}

}  // namespace

void expert_offsets(const int32_t* counts, int n_experts, int32_t* first, int32_t* pfirst,
                    cudaStream_t stream) {
    CPFILL_CHECK(n_experts >= 1 && n_experts <= 1024, "expert_offsets: {} experts (1 to 1024)",
                 n_experts);
    offsets_kernel<<<1, 32, 0, stream>>>(counts, n_experts, first, pfirst);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void gather_quant_fp8(const bf16* y, int64_t d_model, const int32_t* perm, int top_k,
                      const float* weight, const int32_t* counts, const int32_t* first,
                      const int32_t* pfirst, int n_experts, int64_t n_pad, void* xq, float* xs,
                      float* sp, int32_t* inv, cudaStream_t stream) {
    CPFILL_CHECK(d_model % 128 == 0, "gather_quant_fp8: d_model {} is not a multiple of 128",
                 d_model);
    if (n_pad == 0) return;
    gather_quant_kernel<<<warp_blocks(n_pad * (d_model / 128)), 256, 0, stream>>>(
        y, d_model, perm, top_k, weight, counts, first, pfirst, n_experts, n_pad,
        static_cast<uint8_t*>(xq), xs, sp, inv);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void swiglu_quant_fp8(const bf16* gate_up, int64_t m4, int64_t width, float limit,
                      const float* row_scale, void* aq, float* as, cudaStream_t stream) {
    CPFILL_CHECK(width % 128 == 0, "swiglu_quant_fp8: width {} is not a multiple of 128", width);
    if (m4 == 0) return;
    swiglu_quant_kernel<<<warp_blocks(m4 * (width / 128)), 256, 0, stream>>>(
        gate_up, m4, width, limit, row_scale, static_cast<uint8_t*>(aq), as);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void swiglu_quant_fp8_experts(const bf16* gate_up, int64_t n_pad, int64_t width, float limit,
                              const float* row_scale, const int32_t* pfirst, int n_experts,
                              void* aq, float* as, cudaStream_t stream) {
    CPFILL_CHECK(width % 128 == 0, "swiglu_quant_fp8: width {} is not a multiple of 128", width);
    if (n_pad == 0) return;
    swiglu_quant_experts_kernel<<<warp_blocks(n_pad * (width / 128)), 256, 0, stream>>>(
        gate_up, n_pad, width, limit, row_scale, pfirst, n_experts, static_cast<uint8_t*>(aq), as);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
