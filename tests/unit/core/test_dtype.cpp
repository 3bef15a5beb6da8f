// DType names/sizes and the scalar conversions of core/dtype.h, against hand-computed values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/dtype.h"

namespace cpfill {
namespace {

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(DType, NamesSizesAndParseRoundTrip) {
    const DType all[] = {DType::F32,     DType::F16, DType::BF16, DType::F8_E4M3,
                         DType::F8_E8M0, DType::I8,  DType::U8,   DType::I16,
                         DType::I32,     DType::I64, DType::BOOL};
    const size_t sizes[] = {4, 2, 2, 1, 1, 1, 1, 2, 4, 8, 1};
    const char* names[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I8",
                           "U8",  "I16", "I32",  "I64",     "BOOL"};
    for (int i = 0; i < 11; ++i) {
        EXPECT_EQ(dtype_size(all[i]), sizes[i]) << names[i];
        EXPECT_EQ(dtype_name(all[i]), names[i]);
        ASSERT_TRUE(parse_dtype(names[i]).has_value()) << names[i];
        EXPECT_EQ(*parse_dtype(names[i]), all[i]);
        EXPECT_EQ(fmt::format("{}", all[i]), names[i]);
    }
    EXPECT_FALSE(parse_dtype("f32").has_value());  // spellings are case-sensitive
    EXPECT_FALSE(parse_dtype("F8_E5M2").has_value());
    EXPECT_FALSE(parse_dtype("").has_value());
}

TEST(DType, Bf16DecodeAndRoundToNearestEven) {
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, keeps even 0x3f80
    EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, rounds up to even 0x3f82
    EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // just above the tie
    EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);  // just below the tie
    EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000)), 0xbf82);  // sign does not change the rule
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
    // A NaN whose payload sits only in the dropped bits must stay NaN, not become inf.
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001)))));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
    for (uint32_t b = 0; b < 0x10000; b += 7) {  // every finite bf16 survives the round trip
        const uint16_t v = static_cast<uint16_t>(b);
        if ((v & 0x7f80) == 0x7f80) continue;
        EXPECT_EQ(f32_to_bf16(bf16_to_f32(v)), v) << "bf16 bits " << v;
    }
}

TEST(DType, F16Decode) {
    EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
    EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
    EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
    EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(DType, E4m3DecodeSpecialValues) {
    EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);  // largest finite
    EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
    EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);        // exponent 15 is finite in e4m3fn
    EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal 2^-9
    EXPECT_EQ(e4m3_to_f32(0x07), 0.013671875f);  // largest subnormal 7 · 2^-9
    EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);     // smallest normal 2^-6
    EXPECT_EQ(e4m3_to_f32(0x3b), 1.375f);
    EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
    EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
}

TEST(DType, E4m3EncodeRoundsAndSaturates) {
    EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
    EXPECT_EQ(f32_to_e4m3(-448.0f), 0xfe);
    EXPECT_EQ(f32_to_e4m3(460.0f), 0x7e);  // above the max: saturates
    EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // the tie towards the NaN code also saturates
    EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);
    EXPECT_EQ(f32_to_e4m3(-1e6f), 0xfe);
    EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
    EXPECT_EQ(f32_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
    EXPECT_EQ(f32_to_e4m3(0.001953125f), 0x01);   // subnormal 2^-9
    EXPECT_EQ(f32_to_e4m3(0.0009765625f), 0x00);  // 2^-10: tie between 0 and 2^-9, to even 0
    EXPECT_EQ(f32_to_e4m3(0.0029296875f), 0x02);  // 1.5 · 2^-9: tie between codes 1 and 2 → 2
    EXPECT_EQ(f32_to_e4m3(0.0146484375f), 0x08);  // 7.5 · 2^-9: tie, rounds up into the normals
    EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);   // tie between 1.0 (0x38) and 1.125 (0x39) → even
    EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);   // tie between 1.125 (0x39) and 1.25 (0x3a) → even
    EXPECT_EQ(f32_to_e4m3(1.07f), 0x39);     // above the tie
    EXPECT_EQ(f32_to_e4m3(1.96875f), 0x40);  // tie between 1.875 and 2.0, carries the exponent
    EXPECT_EQ(f32_to_e4m3(-1.0625f), 0xb8);
    EXPECT_EQ(f32_to_e4m3(1e-9f), 0x00);
    for (int b = 0; b < 256; ++b) {  // every non-NaN code survives the round trip
        if ((b & 0x7f) == 0x7f) continue;
        EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(b))), b) << "code " << b;
    }
}

TEST(DType, E8m0IsAPowerOfTwo) {
    EXPECT_EQ(e8m0_to_f32(127), 1.0f);
    EXPECT_EQ(e8m0_to_f32(130), 8.0f);
    EXPECT_EQ(e8m0_to_f32(126), 0.5f);
    EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
    EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
    EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, E2m1DecodeAndNibbleOrder) {
    const float magnitudes[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint8_t code = 0; code < 8; ++code) {
        EXPECT_EQ(e2m1_to_f32(code), magnitudes[code]) << "code " << int(code);
        EXPECT_EQ(e2m1_to_f32(code | 0x8), -magnitudes[code]) << "code " << int(code | 0x8);
    }
    EXPECT_EQ(e2m1_to_f32(0xf1), 0.5f);  // only the low 4 bits count
    // Byte 0x21: element 2c is the low nibble (0.5), element 2c+1 the high nibble (1.0).
    const uint8_t byte = 0x21;
    EXPECT_EQ(e2m1_to_f32(byte & 0xf), 0.5f);
    EXPECT_EQ(e2m1_to_f32(byte >> 4), 1.0f);
}

TEST(DType, E2m1EncodeTiesToEvenAndSaturates) {
    EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // ties: to the code with mantissa bit 0
    EXPECT_EQ(f32_to_e2m1(0.75f), 0x2);
    EXPECT_EQ(f32_to_e2m1(1.25f), 0x2);
    EXPECT_EQ(f32_to_e2m1(1.75f), 0x4);
    EXPECT_EQ(f32_to_e2m1(2.5f), 0x4);
    EXPECT_EQ(f32_to_e2m1(3.5f), 0x6);
    EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);
    EXPECT_EQ(f32_to_e2m1(5.01f), 0x7);
    EXPECT_EQ(f32_to_e2m1(0.26f), 0x1);
    EXPECT_EQ(f32_to_e2m1(7.0f), 0x7);  // saturates at 6
    EXPECT_EQ(f32_to_e2m1(-100.0f), 0xf);
    EXPECT_EQ(f32_to_e2m1(-0.6f), 0x9);
    for (uint8_t code = 0; code < 16; ++code)
        EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(code)), code) << "code " << int(code);
}

}  // namespace
}  // namespace cpfill
