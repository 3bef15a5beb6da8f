// Router and SwiGLU activation.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace cpfill::ops {

namespace {
float sqrt_softplus(float x) {
    float sp = x > 20.0f ? x : std::log1p(std::exp(x));  // torch softplus, beta 1, threshold 20
    return std::sqrt(sp);
}
}  // namespace

void route(const float* logits, int64_t n, int n_experts, int top_k, const float* bias,
           const int64_t* hash_ids, float routed_scale, int32_t* idx, float* weight) {
    std::vector<float> score(n_experts), key(n_experts);
    std::vector<int32_t> order(n_experts);
    for (int64_t t = 0; t < n; ++t) {
        for (int e = 0; e < n_experts; ++e) {
            score[e] = sqrt_softplus(logits[t * n_experts + e]);
            key[e] = score[e] + (bias ? bias[e] : 0.0f);
        }
        int32_t* it = idx + t * top_k;
        if (hash_ids) {
            for (int i = 0; i < top_k; ++i) it[i] = static_cast<int32_t>(hash_ids[t * top_k + i]);
        } else {
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                              [&](int32_t a, int32_t b) {
                                  return key[a] > key[b] || (key[a] == key[b] && a < b);
                              });
            std::copy(order.begin(), order.begin() + top_k, it);
        }
        float sum = 0;
        for (int i = 0; i < top_k; ++i) sum += score[it[i]];
        for (int i = 0; i < top_k; ++i)
            weight[t * top_k + i] = score[it[i]] / (sum + 1e-20f) * routed_scale;
    }
}

void swiglu(const float* gate_up, int64_t n, int64_t moe_dim, float limit, float* act) {
    for (int64_t t = 0; t < n; ++t) {
        const float* g = gate_up + t * 2 * moe_dim;
        const float* u = g + moe_dim;
        float* a = act + t * moe_dim;
        for (int64_t i = 0; i < moe_dim; ++i) {
            float gv = g[i], uv = u[i];
            if (limit > 0) {
                gv = std::min(gv, limit);
                uv = std::clamp(uv, -limit, limit);
            }
            a[i] = gv / (1.0f + std::exp(-gv)) * uv;
        }
    }
}

}  // namespace cpfill::ops
