// Log-softmax pieces over one row of logits.
#include "serve/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cpfill::serve {

double log_sum_exp(const float* logits, int64_t vocab) {
    double m = logits[0];
    for (int64_t i = 1; i < vocab; ++i) m = std::max(m, double(logits[i]));
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(double(logits[i]) - m);
    return m + std::log(s);
}

std::vector<std::pair<int32_t, double>> top_logprobs(const float* logits, int64_t vocab, int k,
                                                     double lse) {
    const int64_t n = std::min<int64_t>(std::max(k, 0), vocab);
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    const auto better = [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
    std::vector<std::pair<int32_t, double>> out;
    for (int64_t i = 0; i < n; ++i) out.emplace_back(ids[i], double(logits[ids[i]]) - lse);
    return out;
}

}  // namespace cpfill::serve
