// linear() through cblas_sgemm (OpenBLAS): row-major x · wᵀ.
#include "ops/linear.h"

#include <cblas.h>

namespace cpfill::ops {

void linear(const float* x, int64_t n, int64_t in, int64_t ldx, const float* w, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
    if (n == 0 || out == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x, static_cast<int>(ldx), w, static_cast<int>(in),
                accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace cpfill::ops
