// gemm_bf16: row-major y = x·wᵀ is column-major yᵀ[out, n] = op_T(w)[out, in] · xᵀ[in, n].
#include <atomic>
#include <chrono>
#include <cstdint>

#include "ops/cuda/gemm.h"
#include "ops/gemm_plan_rows.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

GemmContext::GemmContext() : plans_(std::make_shared<PlanCache>()) {
    CPFILL_CUBLAS_CHECK(cublasLtCreate(&handle_));
    CPFILL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmContext::GemmContext(GemmContext& other) : plans_(other.plans_) {
    CPFILL_CUBLAS_CHECK(cublasLtCreate(&handle_));
    CPFILL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmContext::PlanCache::~PlanCache() {
    for (auto& [key, p] : map) {
        cublasLtMatrixLayoutDestroy(p.la);
        cublasLtMatrixLayoutDestroy(p.lb);
        cublasLtMatrixLayoutDestroy(p.lc);
        cublasLtMatmulDescDestroy(p.desc);
    }
}

GemmContext::~GemmContext() {
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(handle_);
}

namespace {

// The descriptors of one GEMM, destroyed on scope exit unless released into the plan cache.
struct Descs {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    ~Descs() {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
    GemmContext::Plan release(cublasLtMatmulAlgo_t algo, int64_t n) {
        GemmContext::Plan p{desc, la, lb, lc, algo, n};
        desc = nullptr;
        la = lb = lc = nullptr;
        return p;
    }
};

// Largest power of two (≤ 256) dividing the address: what the algorithm may assume.
uint32_t alignment(const void* p) {
    uint32_t a = 256;
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a) a /= 2;
    return a;
}

cublasLtMatmulAlgo_t pick_algo(GemmContext& ctx, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                               cublasLtMatrixLayout_t lc, int64_t n, int64_t in, int64_t out,
                               const uint32_t align[3]) {
    cublasLtMatmulPreference_t pref = nullptr;
    CPFILL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx.workspace_bytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t values[4] = {align[0], align[1], align[2], align[2]};
    for (int i = 0; i < 4; ++i)
        cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &values[i], sizeof(uint32_t));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(ctx.handle(), desc, la, lb, lc, lc, pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    CPFILL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 "cuBLASLt has no algorithm for a GEMM of [{}, {}] x [{}, {}]ᵀ (status {})", n, in,
                 out, in, static_cast<int>(st));
    return heur.algo;
}

enum InKind { kBf16 = 0, kF32 = 1, kFp8Tile = 2, kFp8Row = 3 };

// The row counts that share a plan: ops/gemm_plan_rows.h. cuBLASLt's heuristic is asked once per
// class, for the first row count seen in it; its algorithm runs any row count of the class.
// Per-expert GEMMs see a new row count for nearly every expert of every batch, and each
// heuristic call costs ~0.2 ms of host time: exact-n plans made a server's every new prompt, and
// a process's first batch after the warm-up, pay it per expert and layer
// (docs/performance-notes.md).
using ops::gemm_plan_rows;

std::atomic<int64_t> g_plans_made{0}, g_plan_ns{0};  // gemm_plan_stats

// y (fp32 or bf16) = x·wᵀ with x, w both fp32, both bf16 or both e4m3 (block-scaled by w_scale /
// x_scale); see gemm_bf16 and gemm_fp8.
void gemm_impl(GemmContext& ctx, const void* x, int64_t ldx, int64_t n, int64_t in, const void* w,
               int64_t out, void* y, bool y_f32, int64_t ldy, bool accumulate, InKind kind,
               cudaStream_t stream, const float* w_scale = nullptr,
               const float* x_scale = nullptr) {
    const uint32_t align[3] = {alignment(w), alignment(x), alignment(y)};
    const int align_key = static_cast<int>(align[0] | align[1] << 9 | align[2] << 18);
    const GemmContext::Key key{gemm_plan_rows(n), in,        out, ldx, ldy, y_f32,
                               accumulate,        align_key, kind};
    const bool fp8 = kind == kFp8Tile || kind == kFp8Row;
    auto it = ctx.plans().find(key);
    if (it == ctx.plans().end()) {
        const auto t0 = std::chrono::steady_clock::now();
        const cudaDataType_t out_type = y_f32 ? CUDA_R_32F : CUDA_R_16BF;
        const cudaDataType_t in_type = kind == kF32 ? CUDA_R_32F
                                       : fp8        ? CUDA_R_8F_E4M3
                                                    : CUDA_R_16BF;
        Descs d;
        CPFILL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CPFILL_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CPFILL_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        if (fp8) {  // cuBLAS's A is w, its B is x (column-major view of row-major y = x·wᵀ)
            const cublasLtMatmulMatrixScale_t a_mode =
                kind == kFp8Tile ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
            CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
            // The heuristic needs the scale pointers set; the call below sets them each time.
            CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
            CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
        }
        CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.la, in_type, in, out, in));
        CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.lb, in_type, in, n, ldx));
        CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.lc, out_type, out, n, ldy));
        const cublasLtMatmulAlgo_t algo =
            pick_algo(ctx, d.desc, d.la, d.lb, d.lc, n, in, out, align);
        it = ctx.plans().emplace(key, d.release(algo, n)).first;
        g_plans_made.fetch_add(1, std::memory_order_relaxed);
        g_plan_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count(),
                            std::memory_order_relaxed);
    }
    GemmContext::Plan& p = it->second;
    if (p.n != n) {  // another row count of the plan's class
        const uint64_t cols = static_cast<uint64_t>(n);
        CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p.lb, CUBLASLT_MATRIX_LAYOUT_COLS,
                                                             &cols, sizeof(cols)));
        CPFILL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p.lc, CUBLASLT_MATRIX_LAYOUT_COLS,
                                                             &cols, sizeof(cols)));
        p.n = n;
    }
    if (fp8) {
        CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
        CPFILL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t st =
        cublasLtMatmul(ctx.handle(), p.desc, &alpha, w, p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                       &p.algo, ctx.workspace(), ctx.workspace_bytes(), stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // the class's algorithm refuses this row count
        p.algo = pick_algo(ctx, p.desc, p.la, p.lb, p.lc, n, in, out, align);
        st = cublasLtMatmul(ctx.handle(), p.desc, &alpha, w, p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                            &p.algo, ctx.workspace(), ctx.workspace_bytes(), stream);
    }
    CPFILL_CUBLAS_CHECK(st);
}

}  // namespace

void gemm_bf16(GemmContext& ctx, const __nv_bfloat16* x, int64_t ldx, int64_t n, int64_t in,
               const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y_bf16, float* y_f32,
               int64_t ldy, bool accumulate, cudaStream_t stream) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr), "gemm_bf16: give one output");
    CPFILL_CHECK(ldx >= in && ldy >= out, "gemm_bf16: strides {}, {} below widths {}, {}", ldx, ldy,
                 in, out);
    if (n == 0 || out == 0) return;
    void* y = y_bf16 ? static_cast<void*>(y_bf16) : static_cast<void*>(y_f32);
    gemm_impl(ctx, x, ldx, n, in, w, out, y, y_f32 != nullptr, ldy, accumulate, kBf16, stream);
}

void gemm_f32(GemmContext& ctx, const float* x, int64_t ldx, int64_t n, int64_t in, const float* w,
              int64_t out, float* y, int64_t ldy, cudaStream_t stream) {
    CPFILL_CHECK(ldx >= in && ldy >= out, "gemm_f32: strides {}, {} below widths {}, {}", ldx, ldy,
                 in, out);
    if (n == 0 || out == 0) return;
    gemm_impl(ctx, x, ldx, n, in, w, out, y, true, ldy, false, kF32, stream);
}

void gemm_fp8(GemmContext& ctx, const void* xq, const float* x_scale, int64_t n, int64_t in,
              const void* w, const float* w_scale, Fp8Blocks blocks, int64_t out,
              __nv_bfloat16* y_bf16, float* y_f32, int64_t ldy, cudaStream_t stream) {
    CPFILL_CHECK((y_bf16 == nullptr) != (y_f32 == nullptr), "gemm_fp8: give one output");
    CPFILL_CHECK(in % 128 == 0, "gemm_fp8: in {} is not a multiple of 128 (the scale blocks)", in);
    CPFILL_CHECK(ldy >= out, "gemm_fp8: output stride {} below width {}", ldy, out);
    CPFILL_CHECK(x_scale && w_scale, "gemm_fp8: both scales are needed");
    // Measured on an H200 (cuBLAS 13.1): no algorithm for 1, 37 or 129 rows, one for 4, 64, 300.
    // Each row of the activation scales [in/128][n] must start 16-byte aligned.
    CPFILL_CHECK(n % 4 == 0,
                 "gemm_fp8: {} rows; cuBLASLt's block-scaled path needs a multiple of 4 "
                 "(pad the rows: the activation scales' rows must be 16-byte aligned)",
                 n);
    if (n == 0 || out == 0) return;
    void* y = y_bf16 ? static_cast<void*>(y_bf16) : static_cast<void*>(y_f32);
    gemm_impl(ctx, xq, in, n, in, w, out, y, y_f32 != nullptr, ldy, false,
              blocks == Fp8Blocks::Tile128 ? kFp8Tile : kFp8Row, stream, w_scale, x_scale);
}

void linear_bf16(GemmContext& ctx, const __nv_bfloat16* x, int64_t n, int64_t in,
                 const __nv_bfloat16* w, int64_t out, __nv_bfloat16* y_bf16, float* y_f32,
                 bool accumulate, cudaStream_t stream) {
    gemm_bf16(ctx, x, in, n, in, w, out, y_bf16, y_f32, out, accumulate, stream);
}

GemmPlanStats gemm_plan_stats() {
    return {g_plans_made.load(std::memory_order_relaxed),
            g_plan_ns.load(std::memory_order_relaxed) * 1e-9};
}

}  // namespace cpfill::ops::cuda
