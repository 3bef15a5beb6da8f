// rmsnorm: the mean of squares is accumulated in double (rows reach 4·7168 values in mHC), the
// scale is rounded to fp32 and applied as HF does: w · (x · scale).
#include "ops/norm.h"

#include <cmath>

namespace cpfill::ops {

void rmsnorm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
        if (w) {
            for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * scale);
        } else {
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
        }
    }
}

}  // namespace cpfill::ops
