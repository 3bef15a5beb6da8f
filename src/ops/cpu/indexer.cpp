// indexer_select: one BLAS product [n_heads, dim]·[n_eligible, dim]ᵀ, ReLU-weighted head sum,
// partial sort for the top-k.
#include "ops/indexer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/linear.h"

namespace cpfill::ops {

int64_t indexer_select(const float* q, const float* weight, int n_heads, int64_t dim,
                       const float* keys, int64_t n_eligible, int64_t top_k, float scale,
                       int32_t* idx, float* scratch) {
    int64_t k = std::min(top_k, n_eligible);
    if (n_eligible > 0) {
        float* dots = scratch;                          // [n_heads, n_eligible]
        float* score = scratch + n_heads * n_eligible;  // [n_eligible]
        linear(q, n_heads, dim, keys, n_eligible, dots);
        std::fill(score, score + n_eligible, 0.0f);
        for (int h = 0; h < n_heads; ++h)
            for (int64_t w = 0; w < n_eligible; ++w)
                score[w] += std::max(dots[h * n_eligible + w], 0.0f) * scale * weight[h];
        std::vector<int32_t> order(n_eligible);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
            return score[a] > score[b] || (score[a] == score[b] && a < b);
        });
        std::copy(order.begin(), order.begin() + k, idx);
    }
    std::fill(idx + k, idx + top_k, -1);
    return k;
}

}  // namespace cpfill::ops
