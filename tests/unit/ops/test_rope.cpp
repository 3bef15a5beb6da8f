// RoPE tables (plain and YaRN against the spec's worked values) and the interleaved rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/rope.h"

namespace cpfill {
namespace {

TEST(Rope, PlainFrequencies) {
    RopeParams p;
    p.theta = 10000.0;
    ops::RopeTable t(p, 64);
    ASSERT_EQ(t.inv_freq().size(), 32u);
    EXPECT_FLOAT_EQ(t.inv_freq()[0], 1.0f);
    EXPECT_NEAR(t.inv_freq()[16], std::pow(10000.0, -0.5), 1e-9);
}

// docs/architecture.md §3.0: compress table, theta 160000, YaRN factor 16, window 65536.
TEST(Rope, YarnFrequenciesMatchSpec) {
    RopeParams p;
    p.theta = 160000.0;
    p.yarn = true;
    p.factor = 16;
    p.original_max_pos = 65536;
    p.beta_fast = 32;
    p.beta_slow = 1;
    ops::RopeTable t(p, 64);
    const std::vector<std::pair<int, double>> expected = {{0, 1.0},        {15, 3.6355e-3},
                                                          {16, 2.2656e-3}, {20, 2.9698e-4},
                                                          {25, 5.3723e-6}, {31, 5.6805e-7}};
    for (auto [j, w] : expected) EXPECT_NEAR(t.inv_freq()[j] / w, 1.0, 2e-4) << "j=" << j;
}

TEST(Rope, RotatesTrailingPairsAndInverts) {
    RopeParams p;
    ops::RopeTable t(p, 4);  // pairs (ω0 = 1, ω1 = 0.01)
    // Two heads of 6 channels: 2 nope + 4 rope each.
    std::vector<float> x = {1, 2, 1, 0, 0, 1, 3, 4, 2, 0, 1, 1};
    const std::vector<float> orig = x;
    int64_t pos = 3;
    ops::apply_rope(t, x.data(), 1, 12, 2, 6, &pos, false);
    EXPECT_FLOAT_EQ(x[0], 1);  // nope untouched
    EXPECT_FLOAT_EQ(x[1], 2);
    EXPECT_NEAR(x[2], std::cos(3.0), 1e-6);  // (1, 0) rotated by 3 rad
    EXPECT_NEAR(x[3], std::sin(3.0), 1e-6);
    const double a = 3 * 0.01;  // (0, 1) rotated by 0.03 rad
    EXPECT_NEAR(x[4], -std::sin(a), 1e-6);
    EXPECT_NEAR(x[5], std::cos(a), 1e-6);
    EXPECT_NEAR(x[8], 2 * std::cos(3.0), 1e-6);  // second head, same angles
    ops::apply_rope(t, x.data(), 1, 12, 2, 6, &pos, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], orig[i], 1e-6) << i;
}

}  // namespace
}  // namespace cpfill
