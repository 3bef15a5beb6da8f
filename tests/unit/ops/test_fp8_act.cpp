// round_fp8_blocks (ops/fp8_act.h): the CUDA backend's fp8 activation rounding on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "ops/fp8_act.h"

namespace cpfill {
namespace {

// Values on the e4m3 grid with the block's amax 448 (scale 1) come back unchanged; the zero
// block stays zero; a block of amax 1 is rounded on the grid scaled by 1/448 (0.3 · 448 = 134.4
// lies between 128 and 144: 128); the second row (stride 384 > 256) has blocks of its own.
TEST(Fp8Act, RoundsEachBlockOnItsOwnGrid) {
    const int64_t k = 256, ldx = 384;
    std::vector<float> x(2 * ldx, 0.0f), y(2 * k, -1.0f);
    const float grid[] = {448.0f, -3.5f, 0.015625f, 240.0f, -0.875f, 1.0f / 512};
    for (int j = 0; j < 128; ++j) x[j] = grid[j % 6];
    // row 0, block 1: zeros. Row 1, block 0: amax 1.
    x[ldx + 0] = 1.0f;
    x[ldx + 1] = 0.3f;
    x[ldx + 2] = -0.5f;
    for (int j = 0; j < 128; ++j) x[ldx + 128 + j] = 1000.0f * (j % 2 ? 1.0f : -1.0f);
    ops::round_fp8_blocks(x.data(), 2, k, ldx, y.data());
    for (int j = 0; j < 128; ++j) EXPECT_EQ(y[j], x[j]) << j;
    for (int j = 128; j < 256; ++j) EXPECT_EQ(y[j], 0.0f) << j;
    const float s = 1.0f / 448.0f;
    EXPECT_FLOAT_EQ(y[k + 0], 448.0f * s);
    EXPECT_FLOAT_EQ(y[k + 1], 128.0f * s);
    EXPECT_FLOAT_EQ(y[k + 2], -224.0f * s);
    EXPECT_EQ(y[k + 3], 0.0f);
    for (int j = 0; j < 128; ++j) EXPECT_FLOAT_EQ(y[k + 128 + j], x[ldx + 128 + j]) << j;
}

// Random blocks: every value within half a step of 3 mantissa bits (1/16 relative) where it is
// a normal e4m3 number after scaling (≥ 2⁻⁶ of 448), and no block amax changes.
TEST(Fp8Act, StaysWithinE4m3Rounding) {
    const int64_t n = 7, k = 512;
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(n * k), y(n * k);
    for (float& v : x) v = dist(rng);
    ops::round_fp8_blocks(x.data(), n, k, k, y.data());
    for (int64_t b = 0; b < n * k; b += 128) {
        float amax = 0.0f, ymax = 0.0f;
        for (int j = 0; j < 128; ++j) {
            amax = std::max(amax, std::fabs(x[b + j]));
            ymax = std::max(ymax, std::fabs(y[b + j]));
        }
        EXPECT_FLOAT_EQ(ymax, amax) << "block at " << b;
        for (int j = 0; j < 128; ++j) {
            const float v = x[b + j], e = std::fabs(y[b + j] - v);
            if (std::fabs(v) >= amax / 64) {
                EXPECT_LE(e, std::fabs(v) / 16) << b + j;
            }
        }
    }
}

TEST(Fp8Act, RejectsWidthsThatAreNotBlocks) {
    std::vector<float> x(100), y(100);
    EXPECT_THROW(ops::round_fp8_blocks(x.data(), 1, 100, 100, y.data()), std::exception);
}

}  // namespace
}  // namespace cpfill
