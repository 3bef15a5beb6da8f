// Hopper warpgroup MMAs of bf16 operands (wgmma, sm_90a) that only the attention kernel
// attention_wg.cu uses, beside wgmma.cuh's: the logits' m64n64k16, and P·V's m64n256k16 with A from
// registers. Fragment layout of d (fp32, m64nN): thread t of the warpgroup holds rows
// 16·(t/32) + (t%32)/4 and +8, columns 8·j + 2·(t%4) and +1, in d[4j], d[4j+1] (first row) and
// d[4j+2], d[4j+3] (second row).
#pragma once

#include <cstdint>

#include "ops/cuda/wgmma.cuh"

namespace cpfill::ops::cuda {

// d[64×64] (+)= a[64×16] · b[64×16]ᵀ: bf16, a and b K-major. accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t a, uint64_t b,
                                                     int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

// d[64×256] += a[64×16] · b[16×256]: bf16, a from registers in the mma.sync A-fragment layout
// of the warp's 16 rows (a[0]: row g, columns 2·(t%4), +1; a[1]: row g + 8; a[2], a[3]: the same
// rows, columns + 8), b MN-major as in wgmma_m64n256k16_bf16<1>. accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n256k16_bf16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                         uint64_t b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " CPFILL_WGMMA_D128_REGS
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
        "}\n"
        : CPFILL_WGMMA_D128_OUT(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

}  // namespace cpfill::ops::cuda
