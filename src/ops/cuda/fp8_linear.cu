// fp8_linear: the rows in multiples of 4 straight into y, the rest through the 4-row tail.
// fp8_linear_quantised: the same two GEMMs on rows already quantised in the Fp8RowsLayout.
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

// The 4-row tail GEMM into s.tail_y, then its first `tail` rows into y from row `body`.
void tail_gemm(GemmContext& ctx, const Fp8LinearScratch& s, const void* tq, const float* ts,
               int64_t body, int64_t tail, int64_t in, const void* w, const float* w_scale,
               Fp8Blocks blocks, int64_t out, __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy,
               cudaStream_t stream) {
    const size_t elem = y_f32 ? 4 : 2;
    gemm_fp8(ctx, tq, ts, 4, in, w, w_scale, blocks, out,
             y_f32 ? nullptr : reinterpret_cast<__nv_bfloat16*>(s.tail_y),
             y_f32 ? s.tail_y : nullptr, out, stream);
    char* dst = y_f32 ? reinterpret_cast<char*>(y_f32 + body * ldy)
                      : reinterpret_cast<char*>(y_bf16 + body * ldy);
    CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(dst, ldy * elem, s.tail_y, out * elem, out * elem, tail,
                                        cudaMemcpyDeviceToDevice, stream));
}

// Rows [begin, end) of `groups` blocks: thread i of the grid-stride loop zeroes one 16-byte chunk
// of q or sets one scale to 1.
__global__ void rows_zero_kernel(uint8_t* q, float* scale, Fp8RowsLayout lay, int groups,
                                 int64_t begin, int64_t rows) {
    const int64_t chunks = lay.in / 16, kb_n = lay.in / 128;
    const int64_t n_q = groups * rows * chunks, n_s = groups * rows * kb_n;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_q + n_s;
         i += int64_t{gridDim.x} * blockDim.x) {
        if (i < n_q) {
            const int64_t gi = i / (rows * chunks), r = begin + i / chunks % rows;
            *reinterpret_cast<uint4*>(q + gi * lay.q_bytes() + r * lay.in + i % chunks * 16) =
                uint4{};
        } else {
            const int64_t j = i - n_q, gi = j / (rows * kb_n), r = begin + j / kb_n % rows;
            scale[gi * lay.scale_count() + lay.scale_at(r, j % kb_n)] = 1.0f;
        }
    }
}

}  // namespace

void fp8_linear(GemmContext& ctx, const Fp8LinearScratch& s, const __nv_bfloat16* x, int64_t ldx,
                int64_t n, int64_t in, const void* w, const float* w_scale, Fp8Blocks blocks,
                int64_t out, __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy,
                cudaStream_t stream) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr), "fp8_linear: give one output");
    CPFILL_CHECK(in <= s.cols && n * in <= s.capacity && out <= s.out,
                 "fp8_linear: [{}, {}] -> {} exceeds the planned scratch ({} values, {} -> {})", n,
                 in, out, s.capacity, s.cols, s.out);
    if (n == 0 || out == 0) return;
    const int64_t body = n / 4 * 4, tail = n - body;
    if (body > 0) {
        quantize_act_fp8(x, ldx, body, in, s.q, s.scale, stream);
        gemm_fp8(ctx, s.q, s.scale, body, in, w, w_scale, blocks, out, y_bf16, y_f32, ldy, stream);
    }
    if (tail == 0) return;
    quantize_act_fp8(x + body * ldx, ldx, tail, in, s.tail_q, s.tail_scale, stream, 4);
    tail_gemm(ctx, s, s.tail_q, s.tail_scale, body, tail, in, w, w_scale, blocks, out, y_bf16,
              y_f32, ldy, stream);
}

void fp8_linear_quantised(GemmContext& ctx, const Fp8LinearScratch& s, const void* xq,
                          const float* xs, int64_t n, int64_t in, const void* w,
                          const float* w_scale, Fp8Blocks blocks, int64_t out,
                          __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr),
                 "fp8_linear_quantised: give one output");
    CPFILL_CHECK(in % 128 == 0, "fp8_linear_quantised: in {} is not a multiple of 128", in);
    CPFILL_CHECK(out <= s.out, "fp8_linear_quantised: {} outputs exceed the planned tail ({})", out,
                 s.out);
    CPFILL_CHECK(reinterpret_cast<uintptr_t>(xq) % 16 == 0,
                 "fp8_linear_quantised: the quantised rows must be 16-byte aligned");
    if (n == 0 || out == 0) return;
    const Fp8RowsLayout lay{n, in};
    const int64_t body = lay.body(), tail = n - body;
    const auto* q = static_cast<const uint8_t*>(xq);
    if (body > 0)
        gemm_fp8(ctx, q, xs, body, in, w, w_scale, blocks, out, y_bf16, y_f32, ldy, stream);
    if (tail == 0) return;
    tail_gemm(ctx, s, q + body * in, xs + lay.scale_at(body, 0), body, tail, in, w, w_scale, blocks,
              out, y_bf16, y_f32, ldy, stream);
}

void fp8_rows_zero(void* q, float* scale, int64_t n, int64_t in, int groups, int64_t begin,
                   int64_t end, cudaStream_t stream) {
    const Fp8RowsLayout lay{n, in};
    CPFILL_CHECK(in % 128 == 0 && groups >= 1, "fp8_rows_zero: in {}, {} groups", in, groups);
    CPFILL_CHECK(begin >= 0 && end <= lay.padded(),
                 "fp8_rows_zero: rows [{}, {}) outside the {} padded rows", begin, end,
                 lay.padded());
    CPFILL_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0,
                 "fp8_rows_zero: q must be 16-byte aligned");
    if (end <= begin) return;
    const int64_t work = groups * (end - begin) * (in / 16 + in / 128);
    const int blocks = static_cast<int>(std::min<int64_t>((work + 255) / 256, 4096));
    rows_zero_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint8_t*>(q), scale, lay, groups,
                                                 begin, end - begin);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
