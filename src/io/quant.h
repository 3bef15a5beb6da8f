// Conversions of whole weight tensors between fp32 and the checkpoint formats
// (docs/architecture.md §6.4):
//  * bf16 / f16 / f32 element-wise;
//  * fp8 e4m3 with E8M0 block scales over 128×128 tiles: W[r,c] = q[r,c] · 2^(s[r/128, c/128]-127),
//    scale tensor [ceil(rows/128), ceil(cols/128)] (edge tiles partial);
//  * fp4 e2m1 packed two per byte (element 2c in the low nibble) as I8 [rows, cols/2], with E8M0
//    scales per 32 consecutive elements of a row: scale tensor [rows, ceil(cols/32)].
#pragma once

#include "core/tensor.h"

namespace cpfill {

// Any float dtype (F32, BF16, F16) → F32, same shape.
Tensor to_f32(const Tensor& t);
Tensor f32_to_bf16_tensor(const Tensor& t);  // F32 → BF16

struct QuantizedWeight {
    Tensor weight;  // F8_E4M3 [rows, cols] or I8 [rows, cols/2] (fp4)
    Tensor scale;   // F8_E8M0
};

// 2-D F32 → fp8 with power-of-two block scales chosen so the block's amax fits in 448.
QuantizedWeight quantize_fp8_block128(const Tensor& w);
Tensor dequantize_fp8_block128(const Tensor& q, const Tensor& scale);  // → F32 [rows, cols]
// 2-D F32 (cols even) → packed fp4 with power-of-two scales per 1×32 block (amax fits in 6).
QuantizedWeight quantize_fp4_block32(const Tensor& w);
Tensor dequantize_fp4_block32(const Tensor& packed, const Tensor& scale);  // → F32 [rows, cols]

}  // namespace cpfill
