// fp8_linear: the rows in multiples of 4 straight into y, the rest through the 4-row tail.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/grouped_fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

Fp8DenseGemm parse_fp8_dense_gemm(const char* env) {
    const std::string v = env ? env : "cublas";
    CPFILL_CHECK(v == "cublas" || v == "cpfill",
                 "CPFILL_FP8_GEMM={}: expected cublas (the default) or cpfill", v);
    return v == "cpfill" ? Fp8DenseGemm::Cpfill : Fp8DenseGemm::Cublas;
}

Fp8DenseGemm fp8_dense_gemm() {
    static const Fp8DenseGemm choice = parse_fp8_dense_gemm(std::getenv("CPFILL_FP8_GEMM"));
    return choice;
}

const char* fp8_dense_gemm_name(Fp8DenseGemm g) {
    return g == Fp8DenseGemm::Cpfill ? "cpfill" : "cublas";
}

bool fp8_linear_grouped(Fp8DenseGemm g, Fp8Blocks blocks, int64_t in, int64_t out,
                        const __nv_bfloat16* y_bf16, int64_t ldy) {
    // The register epilogue stores bf16 pairs: y and its stride 4-byte aligned.
    return g == Fp8DenseGemm::Cpfill && y_bf16 != nullptr && blocks == Fp8Blocks::Tile128 &&
           in % 128 == 0 && out % 128 == 0 && ldy % 2 == 0 &&
           reinterpret_cast<uintptr_t>(y_bf16) % 4 == 0 && grouped_fp8_supported();
}

void fp8_linear(GemmContext& ctx, const Fp8LinearScratch& s, const __nv_bfloat16* x, int64_t ldx,
                int64_t n, int64_t in, const void* w, const float* w_scale, Fp8Blocks blocks,
                int64_t out, __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream,
                Fp8DenseGemm gemm) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr), "fp8_linear: give one output");
    CPFILL_CHECK(in <= s.cols && n * in <= s.capacity && out <= s.out,
                 "fp8_linear: [{}, {}] -> {} exceeds the planned scratch ({} values, {} -> {})", n,
                 in, out, s.capacity, s.cols, s.out);
    if (n == 0 || out == 0) return;
    const int64_t body = n / 4 * 4, tail = n - body;
    if (body > 0) {
        quantize_act_fp8(x, ldx, body, in, s.q, s.scale, stream);
        if (fp8_linear_grouped(gemm, blocks, in, out, y_bf16, ldy)) {
            // One expert of `body` rows: the scales [in/128][body] are quantize_act_fp8's.
            GroupedFp8Gemm g;
            g.x = s.q;
            g.xs = s.scale;
            g.n_pad = body;
            g.n_experts = 1;
            g.w = w;
            g.ws = w_scale;
            g.in = in;
            g.out = out;
            g.y = y_bf16;
            g.ldy = ldy;
            const bool tma = reinterpret_cast<uintptr_t>(y_bf16) % 16 == 0 && ldy % 8 == 0;
            g.epilogue = tma ? GroupedFp8Epilogue::TmaStore : GroupedFp8Epilogue::Registers;
            grouped_gemm_fp8(g, stream);
        } else {
            gemm_fp8(ctx, s.q, s.scale, body, in, w, w_scale, blocks, out, y_bf16, y_f32, ldy,
                     stream);
        }
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
