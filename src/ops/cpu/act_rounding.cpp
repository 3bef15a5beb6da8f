// round_fp8_blocks and linear_act (ops/act_rounding.h).
#include "ops/act_rounding.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/linear.h"

namespace cpfill::ops {

void round_fp8_blocks(const float* x, int64_t n, int64_t k, int64_t ldx, float* y) {
    CPFILL_CHECK(k % 128 == 0 && ldx >= k,
                 "fp8 activations: {} channels (row stride {}); expected a multiple of 128", k,
                 ldx);
    for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < k; b += 128) {
            const float* src = x + t * ldx + b;
            float* dst = y + t * k + b;
            float amax = 0.0f;
            for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(src[j]));
            const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            for (int j = 0; j < 128; ++j) dst[j] = e4m3_to_f32(f32_to_e4m3(src[j] / s)) * s;
        }
}

void linear_act(ThreadPool& pool, ActRounding r, const float* x, int64_t n, int64_t in, int64_t ldx,
                const float* w, int64_t out, float* y, int64_t ldy) {
    if (r == ActRounding::None) {
        linear(pool, x, n, in, ldx, w, out, y, ldy);
        return;
    }
    std::vector<float> rounded(n * in);
    if (r == ActRounding::Fp8) {
        round_fp8_blocks(x, n, in, ldx, rounded.data());
    } else {
        for (int64_t t = 0; t < n; ++t)
            for (int64_t c = 0; c < in; ++c)
                rounded[t * in + c] = bf16_to_f32(f32_to_bf16(x[t * ldx + c]));
    }
    linear(pool, rounded.data(), n, in, in, w, out, y, ldy);
}

}  // namespace cpfill::ops
