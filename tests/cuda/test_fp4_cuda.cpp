// fp4 experts on the GPU (ops/cuda/fp4.h): weights of the release's form (e2m1 × a power of two
// per 32 columns) pack into fp4 and re-encode into fp8 tiles bit for bit with nothing counted;
// values fp4 cannot hold, and blocks too far below their tile's largest, are counted.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/fp8.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

// e2m1 magnitudes × a sign × 2^(exponent of the value's (row, 32-column) block).
std::vector<float> fp4_like(int64_t rows, int64_t cols, int spread, uint64_t seed) {
    const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    std::mt19937_64 rng(seed);
    std::vector<float> w(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const int k = static_cast<int>((r * 7 + (c / 32) * 3) % (2 * spread + 1)) - spread;
            const float v = mags[rng() % 8] * std::ldexp(1.0f, k - 4);
            w[r * cols + c] = rng() % 2 ? -v : v;
        }
    return w;
}

struct Reencoded {
    std::vector<float> back;  // fp8 tiles dequantised
    unsigned long long pack_inexact = 0, tile_inexact = 0;
};

Reencoded reencode(const std::vector<float>& w, int64_t count, int64_t rows, int64_t cols) {
    const int64_t per = rows * cols;
    const cuda::DeviceBuffer dw = upload(w);
    cuda::DeviceBuffer q(count * per / 2), s(count * per / 32), q8(count * per),
        s8(count * oc::fp8_weight_scales(rows, cols, oc::Fp8Blocks::Tile128) * 4),
        back(count * per * 4), tk(oc::fp4_tile_scratch(count, rows, cols) * 4);
    cuda::DeviceBuffer c1 = upload(std::vector<unsigned long long>{0}),
                       c2 = upload(std::vector<unsigned long long>{0});
    for (int64_t e = 0; e < count; ++e)
        oc::quantize_weight_fp4(dw.as<float>() + e * per, rows, cols, q.as<uint8_t>() + e * per / 2,
                                s.as<uint8_t>() + e * per / 32, c1.as<unsigned long long>(),
                                nullptr);
    oc::fp4_to_fp8_tiles(q.as<uint8_t>(), s.as<uint8_t>(), count, rows, cols, q8.as<uint8_t>(),
                         s8.as<float>(), tk.as<int>(), c2.as<unsigned long long>(), nullptr);
    const int64_t spm = oc::fp8_weight_scales(rows, cols, oc::Fp8Blocks::Tile128);
    for (int64_t e = 0; e < count; ++e)
        oc::dequantize_weight_fp8(q8.as<uint8_t>() + e * per, s8.as<float>() + e * spm, rows, cols,
                                  oc::Fp8Blocks::Tile128, back.as<float>() + e * per, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Reencoded r;
    r.back = download<float>(back, static_cast<size_t>(count * per));
    r.pack_inexact = download<unsigned long long>(c1, 1)[0];
    r.tile_inexact = download<unsigned long long>(c2, 1)[0];
    return r;
}

TEST(Fp4Experts, ReleaseFormWeightsReencodeExactly) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int64_t count = 3, rows = 200, cols = 384;  // a partial row tile
    const std::vector<float> w = fp4_like(count * rows, cols, 4, 1);
    const Reencoded r = reencode(w, count, rows, cols);
    EXPECT_EQ(r.pack_inexact, 0u);
    EXPECT_EQ(r.tile_inexact, 0u);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(r.back[i], w[i]) << "value " << i;
}

TEST(Fp4Experts, WhatFp4OrTheTilesCannotHoldIsCounted) {
    CPFILL_SKIP_WITHOUT_GPU();
    // Random floats are not e2m1 values.
    const Reencoded a = reencode(test_cuda::random_f32(128 * 256, 2), 1, 128, 256);
    EXPECT_GT(a.pack_inexact, 0u);
    // One block 2^20 below the largest of its tile: its 0.5s underflow e4m3.
    std::vector<float> w = fp4_like(128, 256, 1, 3);
    for (int64_t c = 32; c < 64; ++c)
        w[5 * 256 + c] = (c % 2 ? 0.5f : 6.0f) * std::ldexp(1.0f, -24);
    const Reencoded b = reencode(w, 1, 128, 256);
    EXPECT_EQ(b.pack_inexact, 0u);
    EXPECT_GT(b.tile_inexact, 0u);
}

}  // namespace
}  // namespace cpfill
