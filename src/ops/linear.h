// Dense products on the CPU backend (fp32, through BLAS). Weights are stored [out, in] (PyTorch).
#pragma once

#include <cstdint>

#include "core/parallel.h"

namespace cpfill::ops {

// y[n, out] = x[n, in] · w[out, in]ᵀ; with `accumulate`, y += instead of =.
// Strides are row strides in elements (ldx >= in, ldy >= out); pass in/out for contiguous rows.
void linear(const float* x, int64_t n, int64_t in, int64_t ldx, const float* w, int64_t out,
            float* y, int64_t ldy, bool accumulate = false);

inline void linear(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y) {
    linear(x, n, in, in, w, out, y, out, false);
}

// The same product split over the pool's threads (by rows, or by output columns when there are few
// rows); every BLAS call inside is single-threaded (see set_blas_threads).
void linear(ThreadPool& pool, const float* x, int64_t n, int64_t in, int64_t ldx, const float* w,
            int64_t out, float* y, int64_t ldy, bool accumulate = false);

inline void linear(ThreadPool& pool, const float* x, int64_t n, int64_t in, const float* w,
                   int64_t out, float* y) {
    linear(pool, x, n, in, in, w, out, y, out, false);
}

// c[m, n] (+)= a[m, k] · b[k, n] (row strides lda, ldb, ldc).
void matmul(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n,
            int64_t ldb, float* c, int64_t ldc, bool accumulate);

// Sets the number of threads BLAS may use (per process). The CPU backend sets 1 and parallelises
// with its own pools, so that ranks (threads) and BLAS never oversubscribe the cores.
void set_blas_threads(int n);

}  // namespace cpfill::ops
