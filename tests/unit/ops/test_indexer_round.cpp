// The indexer's rounding for the CPU study (ops/indexer_round.h): the Hadamard rotation, the e2m1
// blocks of 32 with power-of-two scales, and round_indexer_rows per format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "ops/act_rounding.h"
#include "ops/indexer_round.h"

namespace cpfill {
namespace {

std::vector<float> gaussian(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

double dot(const float* a, const float* b, int n) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
    return s;
}

// Orthonormal: dot products (so q · k) survive the rotation, and it is its own inverse; Sylvester
// order: column j of H is ((−1)^popcount(i & j))_i / sqrt(128), so e_0 maps to the constant vector
// and e_1 to the alternating one.
TEST(IndexerRound, HadamardIsOrthonormalInSylvesterOrder) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        const std::vector<float> x = gaussian(128, seed), y = gaussian(128, seed + 100);
        std::vector<float> hx = x, hy = y;
        ops::hadamard128(hx.data());
        ops::hadamard128(hy.data());
        const double scale = std::sqrt(dot(x.data(), x.data(), 128) * dot(y.data(), y.data(), 128));
        EXPECT_NEAR(dot(hx.data(), hy.data(), 128), dot(x.data(), y.data(), 128), 1e-5 * scale);
        EXPECT_NEAR(dot(hx.data(), hx.data(), 128), dot(x.data(), x.data(), 128),
                    1e-5 * dot(x.data(), x.data(), 128));
        ops::hadamard128(hx.data());
        for (int i = 0; i < 128; ++i) EXPECT_NEAR(hx[i], x[i], 1e-5) << i;
    }
    const float c = 1.0f / std::sqrt(128.0f);
    std::vector<float> e0(128, 0.0f), e1(128, 0.0f);
    e0[0] = 1.0f;
    e1[1] = 1.0f;
    ops::hadamard128(e0.data());
    ops::hadamard128(e1.data());
    for (int i = 0; i < 128; ++i) {
        EXPECT_FLOAT_EQ(e0[i], c) << i;
        EXPECT_FLOAT_EQ(e1[i], i % 2 ? -c : c) << i;
    }
}

// Block 0: amax 6, scale 1: the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to the even code
// (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4). Block 1: amax 3, scale
// 2^ceil(log2 0.5) = 0.5 (an exact power of two: not rounded up). Block 2: amax 7, scale
// 2^ceil(log2 7/6) = 2 (7 / 2 = 3.5, a tie, goes to 4: 8). Block 3: zeros stay zeros.
TEST(IndexerRound, E2m1BlocksOf32WithPowerOfTwoScales) {
    std::vector<float> x(128, 0.0f);
    const float in0[] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -2.9f, 0.3f};
    const float out0[] = {6, 0, 1, 1, 2, 2, 4, 4, -3, 0.5f};
    for (int j = 0; j < 10; ++j) x[j] = in0[j];
    const float in1[] = {3, 1.2f, -0.1f, 0.2f};  // / 0.5: 6, 2.4 → 2, −0.2 → 0, 0.4 → 0.5
    const float out1[] = {3, 1.0f, 0, 0.25f};
    for (int j = 0; j < 4; ++j) x[32 + j] = in1[j];
    const float in2[] = {7, 1.4f, -0.9f};
    const float out2[] = {8, 1, -1};  // / 2: 3.5 → 4, 0.7 → 0.5, −0.45 → −0.5
    for (int j = 0; j < 3; ++j) x[64 + j] = in2[j];
    ops::round_e2m1_blocks32(x.data(), 128);
    for (int j = 0; j < 10; ++j) EXPECT_EQ(x[j], out0[j]) << "block 0, " << in0[j];
    for (int j = 0; j < 4; ++j) EXPECT_EQ(x[32 + j], out1[j]) << "block 1, " << in1[j];
    for (int j = 0; j < 3; ++j) EXPECT_EQ(x[64 + j], out2[j]) << "block 2, " << in2[j];
    for (int j = 96; j < 128; ++j) EXPECT_EQ(x[j], 0.0f) << j;
    EXPECT_THROW(ops::round_e2m1_blocks32(x.data(), 48), std::runtime_error);
}

// None leaves the rows; Fp8 is round_fp8_blocks; Fp4Hadamard rotates each 128 channels and rounds
// them, each value within the largest e2m1 step's half (one scale, scale < amax / 3) of the
// rotated one.
TEST(IndexerRound, RowsPerFormat) {
    const int64_t n = 3, k = 256;
    const std::vector<float> x = gaussian(n * k, 9);
    std::vector<float> none = x, fp8 = x, ref8(n * k), fp4 = x;
    ops::round_indexer_rows(ops::IndexerRounding::None, none.data(), n, k);
    EXPECT_EQ(none, x);
    ops::round_indexer_rows(ops::IndexerRounding::Fp8, fp8.data(), n, k);
    ops::round_fp8_blocks(x.data(), n, k, k, ref8.data());
    EXPECT_EQ(fp8, ref8);
    EXPECT_NE(fp8, x);
    ops::round_indexer_rows(ops::IndexerRounding::Fp4Hadamard, fp4.data(), n, k);
    std::vector<float> rot = x;
    for (int64_t b = 0; b < n * k; b += 128) ops::hadamard128(rot.data() + b);
    for (int64_t b = 0; b < n * k; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(rot[b + j]));
        for (int j = 0; j < 32; ++j)
            EXPECT_LE(std::fabs(fp4[b + j] - rot[b + j]), amax / 3) << b + j;
    }
    std::vector<float> again = rot;
    ops::round_e2m1_blocks32(again.data(), n * k);
    EXPECT_EQ(fp4, again);
    EXPECT_THROW(ops::round_indexer_rows(ops::IndexerRounding::Fp8, none.data(), 1, 64),
                 std::runtime_error);
}

}  // namespace
}  // namespace cpfill
