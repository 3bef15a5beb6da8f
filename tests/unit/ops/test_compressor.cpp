// compress_pool on hand-computed windows: HCA-style and the CSA overlap (window 0 without Ca).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/compressor.h"

namespace cpfill {
namespace {

TEST(Compressor, NonOverlappingWindows) {
    // ratio 2, dim 1, tokens 0..4 → 2 windows; token 4 is a trailing token.
    std::vector<float> kv = {1, 3, 5, 7, 9}, gate = {0, 0, 1, 0, 0}, bias = {0, 1};
    std::vector<float> out(2);
    ops::compress_pool({2, 1, false}, kv.data(), gate.data(), 0, bias.data(), 0, 2, out.data());
    // window 0: logits (0, 1) → weights (1, e)/(1+e)
    const double e = std::exp(1.0);
    EXPECT_NEAR(out[0], (1 * 1 + 3 * e) / (1 + e), 1e-6);
    // window 1: logits (1, 1) → equal weights
    EXPECT_NEAR(out[1], (5 + 7) / 2.0, 1e-6);
}

TEST(Compressor, OverlapUsesPreviousCaAndCurrentCb) {
    // ratio 2, dim 1, width 2: row t = (Ca, Cb). Gates all zero → plain means over the slots.
    std::vector<float> kv = {1, 10, 2, 20, 3, 30, 4, 40}, gate(8, 0.0f), bias(4, 0.0f);
    std::vector<float> out(2);
    ops::compress_pool({2, 1, true}, kv.data(), gate.data(), 0, bias.data(), 0, 2, out.data());
    EXPECT_NEAR(out[0], (10 + 20) / 2.0, 1e-6);          // window 0: Cb of tokens 0, 1 only
    EXPECT_NEAR(out[1], (1 + 2 + 30 + 40) / 4.0, 1e-6);  // Ca of 0, 1 and Cb of 2, 3
}

TEST(Compressor, RowOffsetReadsLaterWindows) {
    std::vector<float> kv = {5, 7}, gate = {0, 0}, bias = {0, 0};
    std::vector<float> out(1);
    ops::compress_pool({2, 1, false}, kv.data(), gate.data(), 6, bias.data(), 3, 4, out.data());
    EXPECT_NEAR(out[0], 6.0, 1e-6);
    EXPECT_THROW(
        ops::compress_pool({2, 1, false}, kv.data(), gate.data(), 6, bias.data(), 2, 3, out.data()),
        std::exception);
}

}  // namespace
}  // namespace cpfill
