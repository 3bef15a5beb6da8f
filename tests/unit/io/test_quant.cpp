// io/quant: fp32 ↔ bf16/f16, fp8 128×128 and fp4 1×32 block (de)quantisation, against
// hand-computed values, round trips of representable values, and the shape/dtype checks.
#include <cmath>
#include <cstring>
#include <random>

#include "io/quant.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::expect_error;

Tensor filled(DType dtype, Shape shape, uint8_t byte) {
    Tensor t = Tensor::empty(dtype, std::move(shape));
    std::memset(t.raw_mut(), byte, t.nbytes());
    return t;
}

Tensor random_f32(Shape shape, uint32_t seed, float stddev) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
    return t;
}

TEST(Quant, ToF32FromBf16AndF16) {
    Tensor b = Tensor::empty(DType::BF16, {3});
    const uint16_t bits[] = {0x3f80, 0xc000, 0x3fc0};  // 1, -2, 1.5
    std::memcpy(b.raw_mut(), bits, sizeof bits);
    Tensor f = to_f32(b);
    EXPECT_EQ(f.dtype(), DType::F32);
    EXPECT_EQ(f.shape(), (Shape{3}));
    EXPECT_EQ(f.f32()[0], 1.0f);
    EXPECT_EQ(f.f32()[1], -2.0f);
    EXPECT_EQ(f.f32()[2], 1.5f);

    Tensor h = Tensor::empty(DType::F16, {1, 2});
    const uint16_t hbits[] = {0x3c00, 0x7bff};  // 1, 65504
    std::memcpy(h.raw_mut(), hbits, sizeof hbits);
    Tensor hf = to_f32(h);
    EXPECT_EQ(hf.shape(), (Shape{1, 2}));
    EXPECT_EQ(hf.f32()[1], 65504.0f);

    Tensor back = f32_to_bf16_tensor(f);
    EXPECT_EQ(back.dtype(), DType::BF16);
    EXPECT_EQ(std::memcmp(back.raw(), bits, sizeof bits), 0);
    EXPECT_EQ(to_f32(f).f32()[2], 1.5f);  // F32 → F32 is a copy

    expect_error([] { to_f32(Tensor::zeros(DType::I32, {2})); }, {"to_f32", "I32", "[2]"});
    expect_error([] { f32_to_bf16_tensor(Tensor::zeros(DType::BF16, {2})); }, {"F32", "BF16"});
}

TEST(Quant, Fp8DequantUsesTheTileOfEachElementAtBlockEdges) {
    // [130, 200]: tiles rows {0..127, 128..129} × cols {0..127, 128..199}; every code 1.0 (0x38).
    Tensor q = filled(DType::F8_E4M3, {130, 200}, 0x38);
    Tensor s = Tensor::empty(DType::F8_E8M0, {2, 2});
    const uint8_t scales[] = {127, 128, 129, 130};  // 1, 2, 4, 8
    std::memcpy(s.raw_mut(), scales, 4);
    Tensor w = dequantize_fp8_block128(q, s);
    ASSERT_EQ(w.shape(), (Shape{130, 200}));
    auto at = [&](int64_t r, int64_t c) { return w.f32()[r * 200 + c]; };
    EXPECT_EQ(at(0, 0), 1.0f);
    EXPECT_EQ(at(127, 127), 1.0f);
    EXPECT_EQ(at(0, 128), 2.0f);
    EXPECT_EQ(at(127, 199), 2.0f);
    EXPECT_EQ(at(128, 0), 4.0f);
    EXPECT_EQ(at(129, 127), 4.0f);
    EXPECT_EQ(at(128, 128), 8.0f);
    EXPECT_EQ(at(129, 199), 8.0f);
}

TEST(Quant, Fp8QuantiseHandComputedScales) {
    // One row per tile: amax 448 → 2^0; amax 449 → 2^1; amax 224 → 2^-1; zeros → 2^0.
    Tensor w = Tensor::zeros(DType::F32, {1, 512});
    w.f32()[0] = 448.0f;
    w.f32()[1] = -1.5f;
    w.f32()[128] = -449.0f;
    w.f32()[256] = 224.0f;
    w.f32()[257] = 0.001953125f;  // /2^-1 = 2^-8 = code 2 (subnormal)
    QuantizedWeight q = quantize_fp8_block128(w);
    ASSERT_EQ(q.scale.shape(), (Shape{1, 4}));
    const uint8_t* s = q.scale.data<uint8_t>();
    EXPECT_EQ(s[0], 127);
    EXPECT_EQ(s[1], 128);
    EXPECT_EQ(s[2], 126);
    EXPECT_EQ(s[3], 127);
    const uint8_t* c = q.weight.data<uint8_t>();
    EXPECT_EQ(c[0], 0x7e);
    EXPECT_EQ(c[1], 0xbc);    // -1.5
    EXPECT_EQ(c[128], 0xf6);  // -449 / 2 = -224.5 → -224 (step 16 in [128, 256))
    EXPECT_EQ(c[256], 0x7e);
    EXPECT_EQ(c[257], 0x02);
    EXPECT_EQ(c[300], 0x00);  // a zero in tile 2
    EXPECT_EQ(c[400], 0x00);  // the all-zero tile 3
}

TEST(Quant, Fp8RoundTripOfRepresentableValuesIsExact) {
    // Values q · 2^k with q an e4m3 value and one amax of 448 · 2^k per tile: exact.
    Tensor w = Tensor::empty(DType::F32, {130, 200});
    for (int64_t r = 0; r < 130; ++r)
        for (int64_t c = 0; c < 200; ++c) {
            const int k = static_cast<int>(r / 128) * 3 - static_cast<int>(c / 128) * 5;
            const float v =
                (r % 128 == 0 && c % 128 == 0) ? 448.0f : e4m3_to_f32((r * 7 + c) % 0x7e);
            w.f32()[r * 200 + c] = std::ldexp((r + c) % 2 ? -v : v, k);
        }
    QuantizedWeight q = quantize_fp8_block128(w);
    EXPECT_EQ(q.weight.dtype(), DType::F8_E4M3);
    EXPECT_EQ(q.scale.dtype(), DType::F8_E8M0);
    EXPECT_EQ(q.scale.data<uint8_t>()[1], 127 - 5);
    EXPECT_EQ(q.scale.data<uint8_t>()[2], 127 + 3);
    Tensor back = dequantize_fp8_block128(q.weight, q.scale);
    for (int64_t i = 0; i < w.numel(); ++i)
        ASSERT_EQ(back.f32()[i], w.f32()[i]) << "row " << i / 200 << " col " << i % 200;
}

TEST(Quant, Fp8RandomWeightsWithinE4m3Precision) {
    const uint32_t seed = 1234;
    Tensor w = random_f32({257, 300}, seed, 0.02f);
    QuantizedWeight q = quantize_fp8_block128(w);
    ASSERT_EQ(q.scale.shape(), (Shape{3, 3}));
    Tensor back = dequantize_fp8_block128(q.weight, q.scale);
    for (int64_t r = 0; r < 257; ++r)
        for (int64_t c = 0; c < 300; ++c) {
            const float scale = e8m0_to_f32(q.scale.data<uint8_t>()[(r / 128) * 3 + c / 128]);
            const float x = w.f32()[r * 300 + c], y = back.f32()[r * 300 + c];
            // Half a step: 2^-4 relative for normals, 2^-10 · scale absolute for subnormals.
            const float bound = std::max(std::fabs(x) / 16.0f, std::ldexp(scale, -10));
            ASSERT_LE(std::fabs(x - y), bound)
                << "seed " << seed << " at [" << r << ", " << c << "]: " << x << " vs " << y;
        }
    // Each scale is the smallest power of two with amax / scale ≤ 448.
    for (int tile = 0; tile < 9; ++tile) {
        const int64_t tr = tile / 3, tc = tile % 3;
        float amax = 0.0f;
        for (int64_t r = tr * 128; r < std::min<int64_t>(257, tr * 128 + 128); ++r)
            for (int64_t c = tc * 128; c < std::min<int64_t>(300, tc * 128 + 128); ++c)
                amax = std::max(amax, std::fabs(w.f32()[r * 300 + c]));
        const float scale = e8m0_to_f32(q.scale.data<uint8_t>()[tile]);
        EXPECT_LE(amax / scale, 448.0f) << "tile " << tile;
        EXPECT_GT(amax / scale, 224.0f) << "tile " << tile;
    }
}

TEST(Quant, Fp8ChecksShapesAndDtypes) {
    Tensor q = filled(DType::F8_E4M3, {130, 200}, 0);
    expect_error(
        [&] {
            dequantize_fp8_block128(q, filled(DType::F8_E8M0, {1, 2}, 127));
        },
        {"scale", "expected shape [2, 2], found [1, 2]"});
    expect_error(
        [&] {
            dequantize_fp8_block128(q, filled(DType::F32, {2, 2}, 0));
        },
        {"scale", "expected dtype F8_E8M0, found F32"});
    expect_error(
        [&] {
            dequantize_fp8_block128(filled(DType::BF16, {2, 2}, 0),
                                    Tensor::zeros(DType::F8_E8M0, {1, 1}));
        },
        {"weight", "expected dtype F8_E4M3, found BF16"});
    expect_error(
        [] {
            quantize_fp8_block128(Tensor::zeros(DType::F32, {2, 3, 4}));
        },
        {"2-D", "[2, 3, 4]"});
    Tensor bad = Tensor::zeros(DType::F32, {2, 3});
    bad.f32()[4] = std::nanf("");
    expect_error([&] { quantize_fp8_block128(bad); }, {"[1, 1]", "finite"});
}

TEST(Quant, Fp4NibbleOrderLowIsEvenElement) {
    Tensor packed = filled(DType::I8, {1, 1}, 0x21);
    Tensor scale = filled(DType::F8_E8M0, {1, 1}, 127);
    Tensor w = dequantize_fp4_block32(packed, scale);
    ASSERT_EQ(w.shape(), (Shape{1, 2}));
    EXPECT_EQ(w.f32()[0], 0.5f);
    EXPECT_EQ(w.f32()[1], 1.0f);
    // Same byte, scale 2^3, sign bits: 0xa9 → low 0x9 = -0.5, high 0xa = -1.0.
    Tensor w2 = dequantize_fp4_block32(filled(DType::U8, {1, 1}, 0xa9),
                                       filled(DType::F8_E8M0, {1, 1}, 130));
    EXPECT_EQ(w2.f32()[0], -4.0f);
    EXPECT_EQ(w2.f32()[1], -8.0f);
}

TEST(Quant, Fp4QuantiseHandComputed) {
    // Row 0: [0.5, 1.0, 6, -3, 0...] amax 6 → scale 2^0; row 1 doubled → 2^1; row 2 zeros → 2^0.
    Tensor w = Tensor::zeros(DType::F32, {3, 40});
    const float row0[] = {0.5f, 1.0f, 6.0f, -3.0f};
    for (int c = 0; c < 4; ++c) {
        w.f32()[c] = row0[c];
        w.f32()[40 + c] = 2 * row0[c];
    }
    w.f32()[39] = 0.75f;  // alone in the edge block [32, 40): scale 2^-3, 0.75/0.125 = 6
    QuantizedWeight q = quantize_fp4_block32(w);
    ASSERT_EQ(q.weight.dtype(), DType::I8);
    ASSERT_EQ(q.weight.shape(), (Shape{3, 20}));
    ASSERT_EQ(q.scale.shape(), (Shape{3, 2}));
    const uint8_t* p = q.weight.data<uint8_t>();
    const uint8_t* s = q.scale.data<uint8_t>();
    EXPECT_EQ(p[0], 0x21);  // 0.5 low, 1.0 high
    EXPECT_EQ(p[1], 0xd7);  // 6 low (0x7), -3 high (0xd)
    EXPECT_EQ(p[19], 0x70);
    EXPECT_EQ(s[0], 127);
    EXPECT_EQ(s[1], 124);
    EXPECT_EQ(s[2], 128);
    EXPECT_EQ(p[20], 0x21);
    EXPECT_EQ(s[4], 127);
    EXPECT_EQ(p[40], 0x00);
    Tensor back = dequantize_fp4_block32(q.weight, q.scale);
    for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(back.f32()[i], w.f32()[i]) << "index " << i;
}

TEST(Quant, Fp4RandomWeightsScalesAreTight) {
    const uint32_t seed = 77;
    Tensor w = random_f32({5, 96}, seed, 1.0f);
    QuantizedWeight q = quantize_fp4_block32(w);
    Tensor back = dequantize_fp4_block32(q.weight, q.scale);
    for (int64_t r = 0; r < 5; ++r)
        for (int64_t b = 0; b < 3; ++b) {
            const float scale = e8m0_to_f32(q.scale.data<uint8_t>()[r * 3 + b]);
            float amax = 0.0f;
            for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
                const float x = w.f32()[r * 96 + c], y = back.f32()[r * 96 + c];
                amax = std::max(amax, std::fabs(x));
                // Largest gap between e2m1 neighbours is 2 (between 4 and 6): error ≤ 1 · scale.
                ASSERT_LE(std::fabs(x - y), scale)
                    << "seed " << seed << " [" << r << ", " << c << "]";
            }
            EXPECT_LE(amax / scale, 6.0f);
            EXPECT_GT(amax / scale, 3.0f);
        }
}

TEST(Quant, Fp4ChecksShapesAndDtypes) {
    expect_error(
        [] {
            quantize_fp4_block32(Tensor::zeros(DType::F32, {2, 3}));
        },
        {"even", "[2, 3]"});
    expect_error(
        [] {
            dequantize_fp4_block32(Tensor::zeros(DType::I8, {2, 20}),
                                   Tensor::zeros(DType::F8_E8M0, {2, 1}));
        },
        {"scale", "expected shape [2, 2], found [2, 1]"});
    expect_error(
        [] {
            dequantize_fp4_block32(Tensor::zeros(DType::F32, {2, 20}),
                                   Tensor::zeros(DType::F8_E8M0, {2, 2}));
        },
        {"packed", "I8", "F32"});
}

}  // namespace
}  // namespace cpfill
