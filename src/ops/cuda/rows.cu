// Row plumbing kernels (see rows.h).
#include <type_traits>

#include "ops/cuda/rows.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
    return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20));
}

template <class H>
__global__ void embed_kernel(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n,
                             int64_t d, int hc, int written, H* h) {
    const int64_t total = n * d;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t t = i / d, c = i % d;
        const __nv_bfloat16 e = embed[int64_t{tokens[t]} * d + c];
        for (int j = 0; j < written; ++j) {
            if constexpr (std::is_same_v<H, float>)
                h[(t * hc + j) * d + c] = __bfloat162float(e);
            else
                h[(t * hc + j) * d + c] = e;
        }
    }
}

__global__ void hash_kernel(const int64_t* table, const int32_t* tokens, int64_t n, int k,
                            int64_t* out) {
    const int64_t total = n * k;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x)
        out[i] = table[int64_t{tokens[i / k]} * k + i % k];
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        x[i] *= s;
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void iota_kernel(int64_t* out, int64_t n, int64_t step) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        out[i] = i * step;
}

}  // namespace

void rerange_rows(const void* in, int cp, int64_t n_local, int64_t row_bytes, int64_t n_out,
                  void* out, int64_t ld_out, cudaStream_t stream) {
    for (int k = 0; k < cp; ++k) {
        // Rows j with j·cp + k < n_out.
        const int64_t count = std::min<int64_t>(n_local, n_out > k ? (n_out - k + cp - 1) / cp : 0);
        if (count == 0) continue;
        CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(
            static_cast<char*>(out) + k * ld_out, static_cast<size_t>(cp * ld_out),
            static_cast<const char*>(in) + k * n_local * row_bytes, static_cast<size_t>(row_bytes),
            static_cast<size_t>(row_bytes), static_cast<size_t>(count), cudaMemcpyDeviceToDevice,
            stream));
    }
}

namespace {

template <class H>
void embed_impl(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n, int64_t d_model,
                int hc, int written, H* h, cudaStream_t stream) {
    CPFILL_CHECK(written >= 1 && written <= hc,
                 "embed_streams: written must be 1 to hc = {}, found {}", hc, written);
    if (n == 0) return;
    embed_kernel<<<blocks_for(n * d_model), kThreads, 0, stream>>>(embed, tokens, n, d_model, hc,
                                                                   written, h);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void embed_streams(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n, int64_t d_model,
                   int hc, int written, float* h, cudaStream_t stream) {
    embed_impl(embed, tokens, n, d_model, hc, written, h, stream);
}

void embed_streams(const __nv_bfloat16* embed, const int32_t* tokens, int64_t n, int64_t d_model,
                   int hc, int written, __nv_bfloat16* h, cudaStream_t stream) {
    embed_impl(embed, tokens, n, d_model, hc, written, h, stream);
}

void hash_lookup(const int64_t* tid2eid, const int32_t* tokens, int64_t n, int top_k, int64_t* out,
                 cudaStream_t stream) {
    if (n == 0) return;
    hash_kernel<<<blocks_for(n * top_k), kThreads, 0, stream>>>(tid2eid, tokens, n, top_k, out);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void scale_f32(float* x, int64_t n, float s, cudaStream_t stream) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, s);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* y, cudaStream_t stream) {
    if (n == 0) return;
    to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void iota_i64(int64_t* out, int64_t n, int64_t step, cudaStream_t stream) {
    if (n == 0) return;
    iota_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, n, step);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void copy_cols_bf16(const __nv_bfloat16* src, int64_t ld_src, int64_t rows, int64_t cols,
                    __nv_bfloat16* dst, int64_t ld_dst, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(ld_dst * 2), src,
                                        static_cast<size_t>(ld_src * 2),
                                        static_cast<size_t>(cols * 2), static_cast<size_t>(rows),
                                        cudaMemcpyDeviceToDevice, stream));
}

}  // namespace cpfill::ops::cuda
