// bf16 and block-scaled fp8 GEMMs through cuBLASLt (fp32 accumulation): y[n, out] = x[n, in] ·
// w[out, in]ᵀ, the layout of every linear in the model (weights [out, in], rows = tokens).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "ops/fp8_blocks.h"

namespace cpfill::ops::cuda {

// One per device and stream user; owns the cuBLASLt handle and a workspace.
class GemmContext {
  public:
    GemmContext();
    // A context of its own (handle, workspace: one per stream) whose plans are `other`'s: a
    // rank's contexts make each plan once instead of once per stream. Contexts sharing plans
    // must be driven from one host thread (a plan's layouts change with the row count).
    explicit GemmContext(GemmContext& other);
    ~GemmContext();
    GemmContext(const GemmContext&) = delete;
    GemmContext& operator=(const GemmContext&) = delete;
    cublasLtHandle_t handle() const { return handle_; }
    void* workspace() const { return workspace_; }
    size_t workspace_bytes() const { return workspace_bytes_; }
    // The descriptors and cuBLASLt's heuristic choice per problem (row-count class of n — see
    // ops/gemm_plan_rows.h —, in, out, ldx, ldy, fp32 out, accumulate, pointer alignments), made
    // once: a repeated shape (every layer, every expert of a similar row count) costs only the
    // cublasLtMatmul call on the host and a layout update when n changes within the class.
    // The last field: the input kind (0 bf16, 1 fp32, 2 fp8 with 128×128 weight blocks, 3 fp8 with
    // 1×128 weight blocks).
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, int, int>;
    struct Plan {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        cublasLtMatmulAlgo_t algo{};
        int64_t n = 0;  // the row count lb / lc are set to
    };
    std::map<Key, Plan>& plans() { return plans_->map; }

  private:
    struct PlanCache {
        std::map<Key, Plan> map;
        ~PlanCache();  // destroys the descriptors
    };
    std::shared_ptr<PlanCache> plans_;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 32u << 20;
};

// Output dtype: bf16 (y_bf16) or fp32 (y_f32); exactly one is non-null. accumulate: y += x·wᵀ.
// x rows have stride ldx (≥ in), y rows stride ldy (≥ out), in elements.
void gemm_bf16(GemmContext& ctx, const __nv_bfloat16* x, int64_t ldx, int64_t n, int64_t in,
               const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y_bf16, float* y_f32,
               int64_t ldy, bool accumulate, cudaStream_t stream);

// The same in fp32 throughout (fp32 inputs, CUBLAS_COMPUTE_32F: no TF32), y[n, out] fp32.
void gemm_f32(GemmContext& ctx, const float* x, int64_t ldx, int64_t n, int64_t in, const float* w,
              int64_t out, float* y, int64_t ldy, cudaStream_t stream);

using ops::Fp8Blocks;  // ops/fp8_blocks.h: how an fp8 weight is scaled

// y[n, out] (bf16 y_bf16 or fp32 y_f32: exactly one non-null; row stride ldy) = x·wᵀ from e4m3
// inputs: xq [n, in] dense with one fp32 scale per token and 128 channels (x_scale [in/128][n],
// token fastest: quantize_act_fp8), w [out, in] e4m3 with w_scale as `blocks` says. in must be a
// multiple of 128. cuBLASLt's block-scaled path (sm_90, cuBLAS 12.9 or later); an error names the
// shape when it has no algorithm.
void gemm_fp8(GemmContext& ctx, const void* xq, const float* x_scale, int64_t n, int64_t in,
              const void* w, const float* w_scale, Fp8Blocks blocks, int64_t out,
              __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream);

// gemm_bf16 with dense rows (ldx = in, ldy = out).
void linear_bf16(GemmContext& ctx, const __nv_bfloat16* x, int64_t n, int64_t in,
                 const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y_bf16, float* y_f32,
                 bool accumulate, cudaStream_t stream);

// Plans made so far in this process (every GemmContext) and the host seconds spent making them
// (descriptors and cuBLASLt's heuristic): what a cold prefill pays that a warm one does not.
struct GemmPlanStats {
    int64_t made = 0;
    double seconds = 0;
};
GemmPlanStats gemm_plan_stats();

}  // namespace cpfill::ops::cuda
