// fp8_linear: the rows in multiples of 4 straight into y, the rest through the 4-row tail.
#include "core/error.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

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
    const size_t elem = y_f32 ? 4 : 2;
    gemm_fp8(ctx, s.tail_q, s.tail_scale, 4, in, w, w_scale, blocks, out,
             y_f32 ? nullptr : reinterpret_cast<__nv_bfloat16*>(s.tail_y),
             y_f32 ? s.tail_y : nullptr, out, stream);
    char* dst = y_f32 ? reinterpret_cast<char*>(y_f32 + body * ldy)
                      : reinterpret_cast<char*>(y_bf16 + body * ldy);
    CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(dst, ldy * elem, s.tail_y, out * elem, out * elem, tail,
                                        cudaMemcpyDeviceToDevice, stream));
}

}  // namespace cpfill::ops::cuda
