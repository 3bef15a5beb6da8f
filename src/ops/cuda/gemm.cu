// linear_bf16: row-major y = x·wᵀ is column-major yᵀ[out, n] = op_T(w)[out, in] · xᵀ[in, n].
#include "ops/cuda/gemm.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

GemmContext::GemmContext() {
    CPFILL_CUBLAS_CHECK(cublasLtCreate(&handle_));
    CPFILL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmContext::~GemmContext() {
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(handle_);
}

void linear_bf16(GemmContext& ctx, const __nv_bfloat16* x, int64_t n, int64_t in,
                 const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y_bf16, float* y_f32,
                 bool accumulate, cudaStream_t stream) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr), "linear_bf16: give one output");
    if (n == 0 || out == 0) return;
    const cudaDataType_t out_type = y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    CPFILL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CPFILL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CPFILL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
    CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, n, in));
    CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, out_type, out, n, out));
    cublasLtMatmulPreference_t pref = nullptr;
    CPFILL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx.workspace_bytes();
    CPFILL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    CPFILL_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(ctx.handle(), desc, la, lb, lc, lc, pref, 1, &heur, &found));
    CPFILL_CHECK(found > 0, "cuBLASLt has no algorithm for a bf16 GEMM of [{}, {}] x [{}, {}]ᵀ", n,
                 in, out, in);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    void* y = y_bf16 ? static_cast<void*>(y_bf16) : static_cast<void*>(y_f32);
    CPFILL_CUBLAS_CHECK(cublasLtMatmul(ctx.handle(), desc, &alpha, w, la, x, lb, &beta, y, lc, y,
                                       lc, &heur.algo, ctx.workspace(), ws, stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
}

}  // namespace cpfill::ops::cuda
