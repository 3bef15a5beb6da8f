// The routed experts' GEMMs in one cuBLAS call each (cublasGemmGroupedBatchedEx): for every
// expert e with n_e > 0 rows, y_e[n_e, out] = x_e[n_e, in] · w_eᵀ, where expert e's rows start at
// row first_e = Σ_{e' < e} n_e' of x and y (dense rows, the order of sort_by_expert) and
// w_e = w + e · out · in (the stacked expert weights, [out, in] each). One launch for all experts
// instead of one per expert. Measured on the H200 (CUDA 13), it runs at half the rate of one
// cuBLASLt GEMM per expert, so the MoE uses it only when asked (GpuRunOptions::expert_gemm;
// docs/performance-notes.md).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace cpfill::ops::cuda {

class GroupedGemm {
  public:
    // Up to max_experts experts per call. Allocates its device pointer arrays and workspace once.
    explicit GroupedGemm(int max_experts);
    ~GroupedGemm();
    GroupedGemm(const GroupedGemm&) = delete;
    GroupedGemm& operator=(const GroupedGemm&) = delete;

    // counts: the n_e, int32 [n_experts], on the device (for the pointer arrays, built by a
    // kernel on `stream`) and on the host (for the shapes: the same values). Consecutive calls
    // on one stream may reuse the pointer arrays: each call's kernel runs after the previous
    // call's GEMMs in stream order.
    void experts(const int32_t* counts_device, const int32_t* counts_host, int n_experts,
                 const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out,
                 __nv_bfloat16* y, cudaStream_t stream);

  private:
    cublasHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 32u << 20;
    const void** a_ = nullptr;  // device [max_experts]: weights
    const void** b_ = nullptr;  // device [max_experts]: input rows
    void** c_ = nullptr;        // device [max_experts]: output rows
    int max_experts_ = 0;
    std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, size_;
    std::vector<float> alpha_, beta_;
    std::vector<cublasOperation_t> ta_, tb_;
};

}  // namespace cpfill::ops::cuda
