// linear() through cblas_sgemm (OpenBLAS): row-major x · wᵀ.
#include "ops/linear.h"

#include <cblas.h>

#include <algorithm>

namespace cpfill::ops {

void linear(const float* x, int64_t n, int64_t in, int64_t ldx, const float* w, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
    if (n == 0 || out == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x, static_cast<int>(ldx), w, static_cast<int>(in),
                accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void linear(ThreadPool& pool, const float* x, int64_t n, int64_t in, int64_t ldx, const float* w,
            int64_t out, float* y, int64_t ldy, bool accumulate) {
    const int64_t threads = pool.size();
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(in) * out;
    if (threads == 1 || flops < 4e6) {
        linear(x, n, in, ldx, w, out, y, ldy, accumulate);
    } else if (n >= 16 * threads) {
        const int64_t parts = std::min<int64_t>(threads * 4, n / 16);
        pool.parallel_for(parts, [&](int64_t b, int64_t e) {
            for (int64_t p = b; p < e; ++p) {
                const int64_t r0 = n * p / parts, r1 = n * (p + 1) / parts;
                linear(x + r0 * ldx, r1 - r0, in, ldx, w, out, y + r0 * ldy, ldy, accumulate);
            }
        });
    } else {
        const int64_t parts = std::min<int64_t>(threads * 4, std::max<int64_t>(1, out / 64));
        pool.parallel_for(parts, [&](int64_t b, int64_t e) {
            for (int64_t p = b; p < e; ++p) {
                const int64_t c0 = out * p / parts, c1 = out * (p + 1) / parts;
                linear(x, n, in, ldx, w + c0 * in, c1 - c0, y + c0, ldy, accumulate);
            }
        });
    }
}

void matmul(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n,
            int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace cpfill::ops
