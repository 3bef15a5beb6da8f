// compress_pool: softmax over slots per channel in fp32 (max-subtracted), then the weighted sum.
#include "ops/compressor.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace cpfill::ops {

void compress_pool(const PoolSpec& spec, const float* kv, const float* gate, int64_t row0,
                   const float* bias, int64_t w_begin, int64_t w_end, float* out) {
    const int R = spec.ratio;
    const int64_t d = spec.dim;
    const int64_t width = spec.overlap ? 2 * d : d;
    const int n_slots = spec.overlap ? 2 * R : R;
    std::vector<const float*> slot_kv(n_slots), slot_gate(n_slots), slot_bias(n_slots);
    std::vector<float> logit(n_slots);
    for (int64_t w = w_begin; w < w_end; ++w) {
        int n = 0;
        auto add = [&](int64_t token, int64_t channel_offset, int i) {
            int64_t row = token - row0;
            CPFILL_CHECK(row >= 0, "compressor needs token {} but rows start at {}", token, row0);
            slot_kv[n] = kv + row * width + channel_offset;
            slot_gate[n] = gate + row * width + channel_offset;
            slot_bias[n] = bias + static_cast<int64_t>(i) * width + channel_offset;
            ++n;
        };
        if (spec.overlap) {
            if (w > 0)
                for (int i = 0; i < R; ++i) add((w - 1) * R + i, 0, i);  // Ca of window w−1
            for (int i = 0; i < R; ++i) add(w * R + i, d, i);            // Cb of window w
        } else {
            for (int i = 0; i < R; ++i) add(w * R + i, 0, i);
        }
        float* o = out + (w - w_begin) * d;
        for (int64_t c = 0; c < d; ++c) {
            float mx = -INFINITY;
            for (int s = 0; s < n; ++s) {
                logit[s] = slot_gate[s][c] + slot_bias[s][c];
                mx = std::max(mx, logit[s]);
            }
            float sum = 0;
            for (int s = 0; s < n; ++s) sum += (logit[s] = std::exp(logit[s] - mx));
            float acc = 0;
            for (int s = 0; s < n; ++s) acc += slot_kv[s][c] * (logit[s] / sum);
            o[c] = acc;
        }
    }
}

}  // namespace cpfill::ops
