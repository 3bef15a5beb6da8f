// attend_one: logits by BLAS over the gathered keys, fp32 softmax with the sink (HF eager: max over
// logits and sink, sink column dropped after normalising), then P·V.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/linear.h"

namespace cpfill::ops {

void attend_one(const float* q, int n_heads, int64_t head_dim, const AttnKeys& keys,
                const float* sinks, float scale, float* out, float* scratch) {
    const int64_t n_keys = keys.n_window + keys.n_entries;
    float* kv = scratch;                          // [n_keys, head_dim]
    float* logits = scratch + n_keys * head_dim;  // [n_heads, n_keys]
    const size_t row_bytes = head_dim * sizeof(float);
    if (keys.n_window > 0) std::memcpy(kv, keys.window, keys.n_window * row_bytes);
    for (int64_t e = 0; e < keys.n_entries; ++e) {
        int64_t row = keys.entry_idx ? keys.entry_idx[e] : e;
        std::memcpy(kv + (keys.n_window + e) * head_dim, keys.entries + row * head_dim, row_bytes);
    }
    linear(q, n_heads, head_dim, kv, n_keys, logits);
    for (int h = 0; h < n_heads; ++h) {
        float* l = logits + h * n_keys;
        float mx = sinks[h];
        for (int64_t j = 0; j < n_keys; ++j) mx = std::max(mx, l[j] *= scale);
        float sum = std::exp(sinks[h] - mx);
        for (int64_t j = 0; j < n_keys; ++j) sum += (l[j] = std::exp(l[j] - mx));
        for (int64_t j = 0; j < n_keys; ++j) l[j] /= sum;
    }
    // out[n_heads, head_dim] = P[n_heads, n_keys] · kv[n_keys, head_dim]
    for (int h = 0; h < n_heads; ++h) std::fill(out + h * head_dim, out + (h + 1) * head_dim, 0.0f);
    for (int h = 0; h < n_heads; ++h) {
        const float* p = logits + h * n_keys;
        float* o = out + h * head_dim;
        for (int64_t j = 0; j < n_keys; ++j) {
            const float pj = p[j];
            const float* v = kv + j * head_dim;
            for (int64_t c = 0; c < head_dim; ++c) o[c] += pj * v[c];
        }
    }
}

}  // namespace cpfill::ops
