// RMS norms over the last dimension, fp32 (docs/architecture.md §3.0).
#pragma once

#include <cstdint>

namespace cpfill::ops {

// x[rows, n] → y (may alias x): y = x / sqrt(mean(x²) + eps), times w[n] when w != nullptr.
void rmsnorm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y);

}  // namespace cpfill::ops
