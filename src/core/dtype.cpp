// Element types: sizes, safetensors spellings, and exact scalar conversions to and from fp32.
// Encoders round to nearest, ties to even, by scaling |v| by a power of two (exact) so that one
// quantisation step becomes 1 and rounding the result to an integer. See docs/architecture.md §6.4.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace cpfill {

namespace {

struct DTypeEntry {
    DType type;
    std::string_view name;
    size_t size;
};

constexpr std::array<DTypeEntry, 11> kDTypes = {{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
}};

const DTypeEntry& entry(DType t) {
    for (const DTypeEntry& e : kDTypes)
        if (e.type == t) return e;
    CPFILL_FAIL("invalid DType value {}", static_cast<int>(t));
}

// Nearest integer to x >= 0, ties to even. Exact for every float (x + 0.5 is never formed).
float round_half_even(float x) {
    float f = std::floor(x);
    float frac = x - f;  // exact: f and x share the exponent range
    if (frac > 0.5f || (frac == 0.5f && std::fmod(f, 2.0f) != 0.0f)) f += 1.0f;
    return f;
}

constexpr std::array<float, 8> kE2m1Magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

size_t dtype_size(DType t) { return entry(t).size; }

std::string_view dtype_name(DType t) { return entry(t).name; }

std::optional<DType> parse_dtype(std::string_view name) {
    for (const DTypeEntry& e : kDTypes)
        if (e.name == name) return e.type;
    return std::nullopt;
}

float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

uint16_t f32_to_bf16(float v) {
    uint32_t bits = std::bit_cast<uint32_t>(v);
    if (std::isnan(v))
        return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep it a (quiet) NaN
    // Add 0x7fff plus the lowest kept bit: rounds to nearest, ties to even; overflow gives inf.
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t v) {
    const float sign = (v & 0x8000) ? -1.0f : 1.0f;
    const int exp = (v >> 10) & 0x1f;
    const int mant = v & 0x3ff;
    if (exp == 0x1f)
        return mant ? std::numeric_limits<float>::quiet_NaN()
                    : sign * std::numeric_limits<float>::infinity();
    if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);  // subnormal: m · 2^-24
    return sign * std::ldexp(static_cast<float>(mant + 0x400), exp - 25);
}

// e4m3fn: s eeee mmm, bias 7. exp 0 = subnormal m/8 · 2^-6; s1111111 = NaN; no infinities.
float e4m3_to_f32(uint8_t v) {
    const float sign = (v & 0x80) ? -1.0f : 1.0f;
    const int exp = (v >> 3) & 0xf;
    const int mant = v & 0x7;
    if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
    if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
    return sign * std::ldexp(static_cast<float>(mant + 8), exp - 10);
}

uint8_t f32_to_e4m3(float v) {
    const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
    if (std::isnan(v)) return sign | 0x7f;
    const float a = std::fabs(v);
    if (a >= 448.0f) return sign | 0x7e;  // saturate (also +-inf)
    if (a == 0.0f) return sign;
    // Exponent of the binade holding a, clamped to the smallest normal one (subnormals share its
    // step 2^-9). The step within binade e is 2^(e-3).
    const int e = std::max(std::ilogb(a), -6);
    float q = round_half_even(std::ldexp(a, 3 - e));  // in [0, 16]
    int exp_field = e + 7;
    if (q >= 16.0f) {  // rounded up into the next binade
        q = 8.0f;
        ++exp_field;
    }
    if (q < 8.0f) return sign | static_cast<uint8_t>(q);  // subnormal (only when e == -6)
    if (exp_field > 15 || (exp_field == 15 && q > 14.0f)) return sign | 0x7e;
    return sign | static_cast<uint8_t>((exp_field << 3) | (static_cast<int>(q) - 8));
}

float e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

float e2m1_to_f32(uint8_t nibble) {
    const float m = kE2m1Magnitudes[nibble & 0x7];
    return (nibble & 0x8) ? -m : m;
}

// e2m1 has no NaN: NaN maps to code 7 (6.0) with its sign; callers validate finiteness first.
uint8_t f32_to_e2m1(float v) {
    const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
    const float a = std::fabs(v);
    if (std::isnan(a) || a >= 6.0f) return sign | 0x7;
    // Walk the midpoints between neighbouring codes; at a tie pick the even code (mantissa bit 0).
    uint8_t code = 0;
    while (code < 7) {
        const float mid = 0.5f * (kE2m1Magnitudes[code] + kE2m1Magnitudes[code + 1]);
        if (a < mid || (a == mid && code % 2 == 0)) break;
        ++code;
    }
    return sign | code;
}

}  // namespace cpfill
