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
    const int64_t nw = keys.n_window, ne = keys.n_entries, n_keys = nw + ne;
    float* logits = scratch;                       // [n_heads, n_keys]
    float* gathered = scratch + n_heads * n_keys;  // [ne, head_dim] selected entries
    const float* ent = keys.entries;
    if (keys.entry_idx) {
        for (int64_t e = 0; e < ne; ++e)
            std::memcpy(gathered + e * head_dim, keys.entries + keys.entry_idx[e] * head_dim,
                        head_dim * sizeof(float));
        ent = gathered;
    }
    linear(q, n_heads, head_dim, head_dim, keys.window, nw, logits, n_keys);
    linear(q, n_heads, head_dim, head_dim, ent, ne, logits + nw, n_keys);
    for (int h = 0; h < n_heads; ++h) {
        float* l = logits + h * n_keys;
        float mx = sinks[h];
        for (int64_t j = 0; j < n_keys; ++j) mx = std::max(mx, l[j] *= scale);
        float sum = std::exp(sinks[h] - mx);
        for (int64_t j = 0; j < n_keys; ++j) sum += (l[j] = std::exp(l[j] - mx));
        for (int64_t j = 0; j < n_keys; ++j) l[j] /= sum;
    }
    // out[n_heads, head_dim] = P_window · window + P_entries · entries (K = V).
    matmul(logits, n_heads, nw, n_keys, keys.window, head_dim, head_dim, out, head_dim, false);
    matmul(logits + nw, n_heads, ne, n_keys, ent, head_dim, head_dim, out, head_dim, true);
}

}  // namespace cpfill::ops
