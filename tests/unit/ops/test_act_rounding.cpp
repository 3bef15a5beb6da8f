// ops/act_rounding.h: the CUDA backend's activation rounding on the CPU — round_fp8_blocks, and
// linear_act with each ActRounding (none: the plain product; bf16 and fp8: the product of the
// rounded inputs, read with the row stride).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "ops/act_rounding.h"
#include "ops/linear.h"

namespace cpfill {
namespace {

using ops::ActRounding;

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

// linear_act is linear() of the inputs rounded as asked: None the plain product, Bf16 each input
// to nearest even (2.5 + 2^-8 → 2.5: down; 1 + 3·2^-8 → 1 + 2^-6: a tie, to the even neighbour),
// Fp8 the blocks of round_fp8_blocks; x read with its row stride; bit for bit.
TEST(LinearAct, IsTheProductOfTheRoundedInputs) {
    const int64_t n = 3, in = 128, ldx = 160, out = 5;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n * ldx), w(out * in);
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    x[0] = 2.5f + 1.0f / 256;
    x[1] = 1.0f + 3.0f / 256;
    ThreadPool pool(2);
    for (const ActRounding r : {ActRounding::None, ActRounding::Bf16, ActRounding::Fp8}) {
        std::vector<float> rounded(n * in), want(n * out), got(n * out);
        if (r == ActRounding::Fp8) {
            ops::round_fp8_blocks(x.data(), n, in, ldx, rounded.data());
        } else {
            for (int64_t t = 0; t < n; ++t)
                for (int64_t c = 0; c < in; ++c) {
                    const float v = x[t * ldx + c];
                    rounded[t * in + c] = r == ActRounding::Bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
                }
        }
        if (r == ActRounding::Bf16) {
            EXPECT_EQ(rounded[0], 2.5f);
            EXPECT_EQ(rounded[1], 1.0f + 1.0f / 64);
        }
        ops::linear(pool, rounded.data(), n, in, w.data(), out, want.data());
        ops::linear_act(pool, r, x.data(), n, in, ldx, w.data(), out, got.data(), out);
        EXPECT_EQ(got, want) << static_cast<int>(r);
    }
}

}  // namespace
}  // namespace cpfill
