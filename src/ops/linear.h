// Dense products on the CPU backend (fp32, through BLAS). Weights are stored [out, in] (PyTorch).
#pragma once

#include <cstdint>

namespace cpfill::ops {

// y[n, out] = x[n, in] · w[out, in]ᵀ; with `accumulate`, y += instead of =.
// Strides are row strides in elements (ldx >= in, ldy >= out); pass in/out for contiguous rows.
void linear(const float* x, int64_t n, int64_t in, int64_t ldx, const float* w, int64_t out,
            float* y, int64_t ldy, bool accumulate = false);

inline void linear(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y) {
    linear(x, n, in, in, w, out, y, out, false);
}

// Sets the number of threads BLAS may use (per process).
void set_blas_threads(int n);

}  // namespace cpfill::ops
