// Element types of checkpoints and tensors, and scalar conversions between them and fp32.
// Formats: bf16; fp8 e4m3fn (no inf, max 448); E8M0 scale bytes (2^(b-127), 255 = NaN);
// fp4 e2m1 codes (values {0, .5, 1, 1.5, 2, 3, 4, 6} and sign bit 3), packed two per byte with
// element 2c in the low nibble (docs/architecture.md §6.4).
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cpfill {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I16, I32, I64, BOOL };

size_t dtype_size(DType t);                          // bytes per element
std::string_view dtype_name(DType t);                // safetensors spelling: "F32", "F8_E4M3", ...
std::optional<DType> parse_dtype(std::string_view);  // inverse of dtype_name; nullopt if unknown

float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);  // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t v);
float e4m3_to_f32(uint8_t v);
uint8_t f32_to_e4m3(float v);  // round to nearest even, saturating at +-448
float e8m0_to_f32(uint8_t v);
float e2m1_to_f32(uint8_t nibble);  // low 4 bits used
uint8_t f32_to_e2m1(float v);       // nearest representable code, ties to even, saturating at +-6

}  // namespace cpfill

template <>
struct fmt::formatter<cpfill::DType> : fmt::formatter<std::string_view> {
    auto format(cpfill::DType t, fmt::format_context& ctx) const {
        return fmt::formatter<std::string_view>::format(cpfill::dtype_name(t), ctx);
    }
};
