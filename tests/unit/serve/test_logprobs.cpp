// Log-probabilities of a row of logits against a direct log(softmax) in long double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "serve/logprobs.h"

namespace cpfill::serve {
namespace {

TEST(Logprobs, TopKMatchesTheSoftmaxAndItsOrder) {
    const uint64_t seed = 7;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0, 4);
    std::vector<float> row(1000);
    for (float& x : row) x = n(rng);
    row[17] = row[400] = 30;  // a tie at the top: the lower id first
    long double z = 0;
    for (float x : row) z += std::exp(static_cast<long double>(x));
    const double lse = log_sum_exp(row.data(), 1000);
    const auto top = top_logprobs(row.data(), 1000, 5, lse);
    ASSERT_EQ(top.size(), 5u) << "seed " << seed;
    EXPECT_EQ(top[0].first, 17);
    EXPECT_EQ(top[1].first, 400);
    for (size_t i = 0; i < top.size(); ++i) {
        const long double expected = std::log(std::exp((long double)row[top[i].first]) / z);
        EXPECT_NEAR(top[i].second, double(expected), 1e-9) << "rank " << i;
        if (i > 0) {
            EXPECT_GE(row[top[i - 1].first], row[top[i].first]);
        }
    }
    // Nothing outside the five is more likely than the fifth.
    for (int32_t id = 0; id < 1000; ++id) {
        bool in = false;
        for (const auto& t : top) in = in || t.first == id;
        if (!in) {
            EXPECT_LE(row[id], row[top[4].first]) << "id " << id;
        }
    }
    EXPECT_EQ(top_logprobs(row.data(), 3, 10, log_sum_exp(row.data(), 3)).size(), 3u);
}

TEST(Logprobs, LogSumExpIsStableForLargeLogits) {
    std::vector<float> row = {1000, 1000, -1000};
    EXPECT_NEAR(log_sum_exp(row.data(), 3), 1000 + std::log(2.0), 1e-9);
}

}  // namespace
}  // namespace cpfill::serve
