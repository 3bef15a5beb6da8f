// GroupedGemm: a kernel writes the per-expert pointers, then one cublasGemmGroupedBatchedEx.
// Row-major y = x·wᵀ is column-major yᵀ[out, n] = op_T(w)[out, in] · xᵀ[in, n], as in gemm.cu.
#include "core/error.h"
#include "ops/cuda/grouped_gemm.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

// One thread walks the experts in order (n_experts ≤ a few hundred: microseconds) and lists the
// non-empty ones, exactly as the host does from the same counts.
__global__ void expert_pointers(const int32_t* counts, int n_experts, const __nv_bfloat16* x,
                                int64_t in, const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y,
                                const void** a, const void** b, void** c) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int64_t first = 0;
    int g = 0;
    for (int e = 0; e < n_experts; ++e) {
        const int64_t n = counts[e];
        if (n == 0) continue;
        a[g] = w + e * out * in;
        b[g] = x + first * in;
        c[g] = y + first * out;
        first += n;
        ++g;
    }
}

}  // namespace

GroupedGemm::GroupedGemm(int max_experts) : max_experts_(max_experts) {
    CPFILL_CHECK(max_experts >= 1, "grouped GEMM for {} experts", max_experts);
    CPFILL_CUBLAS_CHECK(cublasCreate(&handle_));
    CPFILL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
    CPFILL_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
    CPFILL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a_), max_experts * sizeof(void*)));
    CPFILL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b_), max_experts * sizeof(void*)));
    CPFILL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c_), max_experts * sizeof(void*)));
}

GroupedGemm::~GroupedGemm() {
    if (a_) cudaFree(a_);
    if (b_) cudaFree(b_);
    if (c_) cudaFree(c_);
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasDestroy(handle_);
}

void GroupedGemm::experts(const int32_t* counts_device, const int32_t* counts_host, int n_experts,
                          const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out,
                          __nv_bfloat16* y, cudaStream_t stream) {
    CPFILL_CHECK(n_experts >= 1 && n_experts <= max_experts_,
                 "grouped GEMM: {} experts, expected 1 to {}", n_experts, max_experts_);
    CPFILL_CHECK(in > 0 && out > 0 && in <= INT32_MAX && out <= INT32_MAX,
                 "grouped GEMM: in {} and out {} must be in 1 … 2^31-1", in, out);
    m_.clear();
    n_.clear();
    for (int e = 0; e < n_experts; ++e) {
        const int32_t rows = counts_host[e];
        CPFILL_CHECK(rows >= 0, "grouped GEMM: expert {} has {} rows", e, rows);
        if (rows == 0) continue;
        m_.push_back(static_cast<int>(out));
        n_.push_back(rows);
    }
    const int groups = static_cast<int>(m_.size());
    if (groups == 0) return;
    k_.assign(groups, static_cast<int>(in));
    lda_.assign(groups, static_cast<int>(in));
    ldb_.assign(groups, static_cast<int>(in));
    ldc_.assign(groups, static_cast<int>(out));
    size_.assign(groups, 1);
    alpha_.assign(groups, 1.0f);
    beta_.assign(groups, 0.0f);
    ta_.assign(groups, CUBLAS_OP_T);
    tb_.assign(groups, CUBLAS_OP_N);
    expert_pointers<<<1, 32, 0, stream>>>(counts_device, n_experts, x, in, w, out, y, a_, b_, c_);
    CPFILL_CUDA_CHECK(cudaGetLastError());
    CPFILL_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    CPFILL_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        handle_, ta_.data(), tb_.data(), m_.data(), n_.data(), k_.data(), alpha_.data(), a_,
        CUDA_R_16BF, lda_.data(), b_, CUDA_R_16BF, ldb_.data(), beta_.data(), c_, CUDA_R_16BF,
        ldc_.data(), groups, size_.data(), CUBLAS_COMPUTE_32F));
}

}  // namespace cpfill::ops::cuda
