// Router (sqrt-softplus, bias for selection only, hash ids, scaling) and the SwiGLU clamps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/indexer.h"
#include "ops/moe.h"

namespace cpfill {
namespace {

double ssp(double x) { return std::sqrt(std::log1p(std::exp(x))); }

TEST(Router, BiasChoosesButDoesNotWeigh) {
    std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f}, bias = {0, 0, 0, 5};
    std::vector<int32_t> idx(2);
    std::vector<float> w(2);
    ops::route(logits.data(), 1, 4, 2, bias.data(), nullptr, 1.5f, idx.data(), w.data());
    EXPECT_EQ(idx[0], 3);  // biased to the top
    EXPECT_EQ(idx[1], 2);
    const double s3 = ssp(-1), s2 = ssp(2);
    EXPECT_NEAR(w[0], 1.5 * s3 / (s3 + s2), 1e-6);
    EXPECT_NEAR(w[1], 1.5 * s2 / (s3 + s2), 1e-6);
}

TEST(Router, HashIdsUseLearnedScores) {
    std::vector<float> logits = {0.0f, 1.0f, 2.0f, 30.0f};
    std::vector<int64_t> hash = {0, 1};
    std::vector<int32_t> idx(2);
    std::vector<float> w(2);
    ops::route(logits.data(), 1, 4, 2, nullptr, hash.data(), 1.0f, idx.data(), w.data());
    EXPECT_EQ(idx[0], 0);
    EXPECT_EQ(idx[1], 1);
    EXPECT_NEAR(w[0], ssp(0) / (ssp(0) + ssp(1)), 1e-6);
}

TEST(SwiGlu, ClampsGateAboveAndUpBothSides) {
    std::vector<float> gu = {20.0f, -20.0f, 20.0f, -20.0f};  // gate (20, −20), up (20, −20)
    std::vector<float> act(2);
    ops::swiglu(gu.data(), 1, 2, 10.0f, act.data());
    EXPECT_NEAR(act[0], 10.0 / (1 + std::exp(-10.0)) * 10.0, 1e-4);   // gate 10, up 10
    EXPECT_NEAR(act[1], -20.0 / (1 + std::exp(20.0)) * -10.0, 1e-9);  // gate −20 unclamped
}

TEST(Indexer, SelectsTopScoresAndPadsWithMinusOne) {
    // One head, dim 1, weight 1: scores = relu(q·k) = relu(k).
    std::vector<float> q = {1}, wt = {1}, keys = {0.5f, -1.0f, 2.0f, 1.0f, 9.0f};
    std::vector<int32_t> idx(4);
    std::vector<float> scratch(16);
    // Only 4 entries eligible (entry 4 is in the future), top 3 of them.
    int64_t k = ops::indexer_select(q.data(), wt.data(), 1, 1, keys.data(), 4, 3, 1.0f, idx.data(),
                                    scratch.data());
    EXPECT_EQ(k, 3);
    EXPECT_EQ(idx[0], 2);
    EXPECT_EQ(idx[1], 3);
    EXPECT_EQ(idx[2], 0);
    k = ops::indexer_select(q.data(), wt.data(), 1, 1, keys.data(), 2, 4, 1.0f, idx.data(),
                            scratch.data());
    EXPECT_EQ(k, 2);
    EXPECT_EQ(idx[2], -1);
    EXPECT_EQ(idx[3], -1);
}

}  // namespace
}  // namespace cpfill
