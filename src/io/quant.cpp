// Whole-tensor conversions between fp32 and the checkpoint formats (docs/architecture.md §6.4).
// Block scales are E8M0 powers of two 2^k with k the smallest integer such that amax / 2^k fits
// the element format (448 for e4m3, 6 for e2m1); dividing by 2^k is exact, so the only rounding
// is the element encoder's (nearest, ties to even). An all-zero block gets 2^0 (byte 127).
#include "io/quant.h"

#include <algorithm>
#include <cmath>

namespace cpfill {

namespace {

constexpr int64_t kFp8Block = 128;  // fp8: 128×128 tiles
constexpr int64_t kFp4Block = 32;   // fp4: 1×32 blocks along a row

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_2d(const Tensor& t, DType dtype, const char* what) {
    CPFILL_CHECK(t.dtype() == dtype, "{}: expected dtype {}, found {}", what, dtype, t.dtype());
    CPFILL_CHECK(t.ndim() == 2, "{}: expected a 2-D tensor, found shape {}", what,
                 shape_str(t.shape()));
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
    CPFILL_CHECK(t.shape() == expected, "{}: expected shape {}, found {}", what,
                 shape_str(expected), shape_str(t.shape()));
}

// E8M0 byte of the smallest 2^k (k in [-127, 127]) with amax / 2^k <= fmax; 127 when amax == 0.
uint8_t block_scale(float amax, float fmax) {
    if (amax == 0.0f) return 127;
    int k = std::ilogb(amax) - std::ilogb(fmax) - 1;  // amax > fmax · 2^k here
    while (amax > std::ldexp(fmax, k)) ++k;
    k = std::max(k, -127);
    return static_cast<uint8_t>(k + 127);
}

void check_finite(float v, int64_t r, int64_t c, const char* what) {
    CPFILL_CHECK(std::isfinite(v), "{}: element [{}, {}] is {}, expected a finite value", what, r,
                 c, v);
}

}  // namespace

Tensor to_f32(const Tensor& t) {
    if (t.dtype() == DType::F32) return t.clone();
    CPFILL_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F16,
                 "to_f32: expected dtype F32, BF16 or F16, found {} (shape {})", t.dtype(),
                 shape_str(t.shape()));
    Tensor out = Tensor::empty(DType::F32, t.shape());
    const uint16_t* src = t.data<uint16_t>();
    float* dst = out.f32();
    const bool bf16 = t.dtype() == DType::BF16;
    for (int64_t i = 0; i < t.numel(); ++i)
        dst[i] = bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
    return out;
}

Tensor f32_to_bf16_tensor(const Tensor& t) {
    CPFILL_CHECK(t.dtype() == DType::F32, "f32_to_bf16_tensor: expected dtype F32, found {}",
                 t.dtype());
    Tensor out = Tensor::empty(DType::BF16, t.shape());
    const float* src = t.f32();
    uint16_t* dst = out.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = f32_to_bf16(src[i]);
    return out;
}

QuantizedWeight quantize_fp8_block128(const Tensor& w) {
    check_2d(w, DType::F32, "quantize_fp8_block128: weight");
    const int64_t rows = w.dim(0), cols = w.dim(1);
    const int64_t tile_rows = ceil_div(rows, kFp8Block), tile_cols = ceil_div(cols, kFp8Block);
    QuantizedWeight q{Tensor::empty(DType::F8_E4M3, {rows, cols}),
                      Tensor::empty(DType::F8_E8M0, {tile_rows, tile_cols})};
    const float* src = w.f32();                // f32 [rows, cols]
    uint8_t* dst = q.weight.data<uint8_t>();   // e4m3 [rows, cols]
    uint8_t* scale = q.scale.data<uint8_t>();  // e8m0 [tile_rows, tile_cols]
    for (int64_t tr = 0; tr < tile_rows; ++tr) {
        const int64_t r0 = tr * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
        for (int64_t tc = 0; tc < tile_cols; ++tc) {
            const int64_t c0 = tc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c) {
                    check_finite(src[r * cols + c], r, c, "quantize_fp8_block128: weight");
                    amax = std::max(amax, std::fabs(src[r * cols + c]));
                }
            const uint8_t s = block_scale(amax, 448.0f);
            scale[tr * tile_cols + tc] = s;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c)
                    dst[r * cols + c] = f32_to_e4m3(std::ldexp(src[r * cols + c], 127 - s));
        }
    }
    return q;
}

Tensor dequantize_fp8_block128(const Tensor& q, const Tensor& scale) {
    check_2d(q, DType::F8_E4M3, "dequantize_fp8_block128: weight");
    check_2d(scale, DType::F8_E8M0, "dequantize_fp8_block128: scale");
    const int64_t rows = q.dim(0), cols = q.dim(1);
    const int64_t tile_cols = ceil_div(cols, kFp8Block);
    check_shape(scale, {ceil_div(rows, kFp8Block), tile_cols},
                "dequantize_fp8_block128: scale (ceil(rows/128), ceil(cols/128))");
    Tensor out = Tensor::empty(DType::F32, {rows, cols});
    const uint8_t* src = q.data<uint8_t>();
    const uint8_t* s = scale.data<uint8_t>();
    float* dst = out.f32();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            dst[r * cols + c] = e4m3_to_f32(src[r * cols + c]) *
                                e8m0_to_f32(s[(r / kFp8Block) * tile_cols + c / kFp8Block]);
    return out;
}

QuantizedWeight quantize_fp4_block32(const Tensor& w) {
    check_2d(w, DType::F32, "quantize_fp4_block32: weight");
    const int64_t rows = w.dim(0), cols = w.dim(1);
    CPFILL_CHECK(cols % 2 == 0,
                 "quantize_fp4_block32: weight: expected an even column count, "
                 "found shape {}",
                 shape_str(w.shape()));
    const int64_t blocks = ceil_div(cols, kFp4Block);
    QuantizedWeight q{Tensor::zeros(DType::I8, {rows, cols / 2}),
                      Tensor::empty(DType::F8_E8M0, {rows, blocks})};
    const float* src = w.f32();                // f32 [rows, cols]
    uint8_t* dst = q.weight.data<uint8_t>();   // e2m1 x2 [rows, cols/2]
    uint8_t* scale = q.scale.data<uint8_t>();  // e8m0 [rows, blocks]
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = src + r * cols;
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t c0 = b * kFp4Block, c1 = std::min(cols, c0 + kFp4Block);
            float amax = 0.0f;
            for (int64_t c = c0; c < c1; ++c) {
                check_finite(row[c], r, c, "quantize_fp4_block32: weight");
                amax = std::max(amax, std::fabs(row[c]));
            }
            const uint8_t s = block_scale(amax, 6.0f);
            scale[r * blocks + b] = s;
            for (int64_t c = c0; c < c1; ++c) {
                const uint8_t code = f32_to_e2m1(std::ldexp(row[c], 127 - s));
                dst[r * (cols / 2) + c / 2] |=
                    (c % 2 == 0) ? code : static_cast<uint8_t>(code << 4);
            }
        }
    }
    return q;
}

Tensor dequantize_fp4_block32(const Tensor& packed, const Tensor& scale) {
    CPFILL_CHECK(packed.dtype() == DType::I8 || packed.dtype() == DType::U8,
                 "dequantize_fp4_block32: packed weight: expected dtype I8 (or U8), found {}",
                 packed.dtype());
    CPFILL_CHECK(packed.ndim() == 2,
                 "dequantize_fp4_block32: packed weight: expected a 2-D tensor, found shape {}",
                 shape_str(packed.shape()));
    check_2d(scale, DType::F8_E8M0, "dequantize_fp4_block32: scale");
    const int64_t rows = packed.dim(0), cols = 2 * packed.dim(1);
    const int64_t blocks = ceil_div(cols, kFp4Block);
    check_shape(scale, {rows, blocks},
                "dequantize_fp4_block32: scale (rows, ceil(2*packed_cols/32))");
    Tensor out = Tensor::empty(DType::F32, {rows, cols});
    const uint8_t* src = packed.data<uint8_t>();
    const uint8_t* s = scale.data<uint8_t>();
    float* dst = out.f32();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const uint8_t byte = src[r * (cols / 2) + c / 2];
            const uint8_t code = (c % 2 == 0) ? (byte & 0xf) : (byte >> 4);  // 2c low, 2c+1 high
            dst[r * cols + c] = e2m1_to_f32(code) * e8m0_to_f32(s[r * blocks + c / kFp4Block]);
        }
    return out;
}

}  // namespace cpfill
