// expert_offsets, gather_quant_fp8 and swiglu_quant_fp8(_experts): one warp per row, a half-warp
// per 128 channels, 4 (SwiGLU: 8) 16-byte loads in flight per lane (fp8_device::quantize_row128).
#include "core/error.h"
#include "ops/cuda/fp8_device.cuh"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/swiglu_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

using bf16 = __nv_bfloat16;

unsigned warp_blocks(int64_t warps) {  // 8 warps per block of 256
    return static_cast<unsigned>((warps + 7) / 8);
}

__global__ void offsets_kernel(const int32_t* counts, int E, int32_t* first, int32_t* pfirst,
                               int32_t shared_rows) {
    if (threadIdx.x != 0) return;
    int32_t f = 0, pf = 0;
    for (int e = 0; e < E; ++e) {
        first[e] = f;
        pfirst[e] = pf;
        const int32_t c = counts[e];
        f += c;
        pf += static_cast<int32_t>(padded_rows(c));
    }
    first[E] = f;
    pfirst[E] = pf;
    if (shared_rows == 0) return;
    first[E + 1] = f + shared_rows;
    pfirst[E + 1] = pf + static_cast<int32_t>(padded_rows(shared_rows));
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

// One warp per padded row p: its expert and assignment looked up once, then the row quantised.
// Rows of expert E (shared_rows > 0) are the shared expert's: y's rows in order, weight 1.
template <bool kVec>
__global__ void gather_quant_kernel(const bf16* y, int64_t D, const int32_t* perm, int top_k,
                                    const float* weight, const int32_t* counts,
                                    const int32_t* first, const int32_t* pfirst, int E,
                                    int64_t n_pad, uint8_t* xq, float* xs, float* sp, int32_t* inv,
                                    int32_t shared_rows) {
    const int64_t p = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    if (p >= n_pad) return;
    const int e = expert_of(pfirst, shared_rows > 0 ? E + 1 : E, p);
    const bool shared = e == E;
    const int64_t i = p - pfirst[e], m4 = pfirst[e + 1] - pfirst[e], kb_n = D / 128;
    const bool valid = i < (shared ? shared_rows : counts[e]);
    const int32_t a = valid && !shared ? perm[first[e] + i] : 0;
    const int64_t row = shared ? i : int64_t{a / top_k};
    fp8_device::quantize_row128<kVec>(valid ? y + row * D : nullptr, kb_n, xq + p * D,
                                      xs + int64_t{pfirst[e]} * kb_n + i, m4);
    if (threadIdx.x % 32 != 0) return;
    sp[p] = !valid ? 0.0f : shared ? 1.0f : weight[a];
    if (valid && !shared) inv[a] = static_cast<int32_t>(p);
}

// quantize_row128 of the SwiGLU of one row's blocks [kb_first, kb_n) (gate at g_row, up width
// further): q e4m3 [width], block kb's scale at scale[kb · scale_stride].
template <bool kVec>
__device__ void swiglu_quant_row(const bf16* g_row, int64_t width, float limit, float rs,
                                 uint8_t* q, float* scale, int64_t scale_stride,
                                 int64_t kb_first = 0, int64_t kb_n = -1) {
    using fp8_device::kRowLoads;
    using fp8_device::load_bf16x8;
    const int h = threadIdx.x % 32 / 16, c = threadIdx.x % 16 * 8;
    if (kb_n < 0) kb_n = width / 128;
    for (int64_t kb0 = kb_first; kb0 < kb_n; kb0 += 2 * kRowLoads) {
        uint4 g_raw[kRowLoads], u_raw[kRowLoads];
#pragma unroll
        for (int l = 0; l < kRowLoads; ++l) {
            const int64_t kb = kb0 + 2 * l + h;
            const bool in = kb < kb_n;
            g_raw[l] = in ? load_bf16x8<kVec>(g_row + kb * 128 + c) : uint4{};
            u_raw[l] = in ? load_bf16x8<kVec>(g_row + width + kb * 128 + c) : uint4{};
        }
#pragma unroll
        for (int l = 0; l < kRowLoads; ++l) {
            float g[8], up[8], v[8];
            fp8_device::bf16x8_to_float(g_raw[l], g);
            fp8_device::bf16x8_to_float(u_raw[l], up);
            for (int j = 0; j < 8; ++j) v[j] = swiglu_one(g[j], up[j], limit, rs);
            fp8_device::quantize_block<kVec>(v, kb0 + 2 * l + h, kb_n, q, scale, scale_stride);
        }
    }
}

// One warp per row of one expert's padded block.
template <bool kVec>
__global__ void swiglu_quant_kernel(const bf16* gu, int64_t m4, int64_t width, float limit,
                                    const float* row_scale, uint8_t* aq, float* as) {
    // One expert's rows are few (~1,500 at 64k tokens): a warp takes one step's 8 blocks of a
    // row, not the whole row, so the launch has enough warps to hide the loads' latency.
    constexpr int64_t kStep = 2 * fp8_device::kRowLoads;
    const int64_t parts = (width / 128 + kStep - 1) / kStep;
    const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int64_t r = w / parts, kb0 = w % parts * kStep;
    if (r >= m4) return;
    swiglu_quant_row<kVec>(gu + r * 2 * width, width, limit, row_scale ? row_scale[r] : 1.0f,
                           aq + r * width, as + r, m4, kb0,
                           kb0 + kStep < width / 128 ? kb0 + kStep : width / 128);
}

// swiglu_quant_kernel over the padded rows of all experts: row p of expert e (found in pfirst)
// writes its scales into that expert's [width/128][m4] block.
template <bool kVec>
__global__ void swiglu_quant_experts_kernel(const bf16* gu, int64_t n_pad, int64_t width,
                                            float limit, const float* row_scale,
                                            const int32_t* pfirst, int E, uint8_t* aq, float* as) {
    const int64_t p = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    if (p >= n_pad) return;
    const int e = expert_of(pfirst, E, p);
    const int64_t i = p - pfirst[e], m4 = pfirst[e + 1] - pfirst[e];
    swiglu_quant_row<kVec>(gu + p * 2 * width, width, limit, row_scale[p], aq + p * width,
                           as + int64_t{pfirst[e]} * (width / 128) + i, m4);
}

}  // namespace

void expert_offsets(const int32_t* counts, int n_experts, int32_t* first, int32_t* pfirst,
                    cudaStream_t stream, int64_t shared_rows) {
    CPFILL_CHECK(n_experts >= 1 && n_experts <= 1024, "expert_offsets: {} experts (1 to 1024)",
                 n_experts);
    CPFILL_CHECK(shared_rows >= 0 && shared_rows < (int64_t{1} << 30),
                 "expert_offsets: {} shared rows (0 to 2^30)", shared_rows);
    offsets_kernel<<<1, 32, 0, stream>>>(counts, n_experts, first, pfirst,
                                         static_cast<int32_t>(shared_rows));
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void gather_quant_fp8(const bf16* y, int64_t d_model, const int32_t* perm, int top_k,
                      const float* weight, const int32_t* counts, const int32_t* first,
                      const int32_t* pfirst, int n_experts, int64_t n_pad, void* xq, float* xs,
                      float* sp, int32_t* inv, cudaStream_t stream, int64_t shared_rows) {
    CPFILL_CHECK(d_model % 128 == 0, "gather_quant_fp8: d_model {} is not a multiple of 128",
                 d_model);
    CPFILL_CHECK(shared_rows >= 0 && shared_rows < (int64_t{1} << 30),
                 "gather_quant_fp8: {} shared rows (0 to 2^30)", shared_rows);
    if (n_pad == 0) return;
    auto* kernel = fp8_device::rows_vectorisable(y, d_model, xq) ? gather_quant_kernel<true>
                                                                 : gather_quant_kernel<false>;
    kernel<<<warp_blocks(n_pad), 256, 0, stream>>>(
        y, d_model, perm, top_k, weight, counts, first, pfirst, n_experts, n_pad,
        static_cast<uint8_t*>(xq), xs, sp, inv, static_cast<int32_t>(shared_rows));
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void swiglu_quant_fp8(const bf16* gate_up, int64_t m4, int64_t width, float limit,
                      const float* row_scale, void* aq, float* as, cudaStream_t stream) {
    CPFILL_CHECK(width % 128 == 0, "swiglu_quant_fp8: width {} is not a multiple of 128", width);
    if (m4 == 0) return;
    auto* kernel = fp8_device::rows_vectorisable(gate_up, 2 * width, aq)
                       ? swiglu_quant_kernel<true>
                       : swiglu_quant_kernel<false>;
    const int64_t parts = (width / 128 + 2 * fp8_device::kRowLoads - 1) /
                          (2 * fp8_device::kRowLoads);  // warps per row
    kernel<<<warp_blocks(m4 * parts), 256, 0, stream>>>(gate_up, m4, width, limit, row_scale,
                                                        static_cast<uint8_t*>(aq), as);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void swiglu_quant_fp8_experts(const bf16* gate_up, int64_t n_pad, int64_t width, float limit,
                              const float* row_scale, const int32_t* pfirst, int n_experts,
                              void* aq, float* as, cudaStream_t stream) {
    CPFILL_CHECK(width % 128 == 0, "swiglu_quant_fp8: width {} is not a multiple of 128", width);
    if (n_pad == 0) return;
    auto* kernel = fp8_device::rows_vectorisable(gate_up, 2 * width, aq)
                       ? swiglu_quant_experts_kernel<true>
                       : swiglu_quant_experts_kernel<false>;
    kernel<<<warp_blocks(n_pad), 256, 0, stream>>>(gate_up, n_pad, width, limit, row_scale, pfirst,
                                                   n_experts, static_cast<uint8_t*>(aq), as);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
