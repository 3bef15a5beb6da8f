// The routed experts' fp8 GEMMs in one launch (docs/fp8.md, "The grouped fp8 expert GEMM"): for
// every expert e, y_e[m4_e, out] = x_e[m4_e, in] · w_eᵀ over its padded rows (ops/cuda/moe_fp8.h),
// e4m3 operands with fp32 block scales, fp32 accumulation, bf16 out. A persistent Hopper kernel
// (TMA + wgmma, sm_90a): tiles of 128 rows × 256 outputs of all experts are dealt to the
// multiprocessors, so no expert waits for a launch and no wave is half empty.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// How the kernel writes its bf16 output tiles (both give the same bits; grouped_fp8.cu has the
// layouts). Registers: every consumer thread stores its accumulators straight to global memory
// (4-byte stores), 4 pipeline stages. TmaStore: the consumers stage their tile in shared memory
// and one thread each hands it to TMA bulk tensor stores that run on while the next tile
// computes, 3 pipeline stages (the output tiles take the fourth's space).
enum class GroupedFp8Epilogue { Registers, TmaStore };

inline const char* grouped_fp8_epilogue_name(GroupedFp8Epilogue e) {
    return e == GroupedFp8Epilogue::Registers ? "registers" : "tma_store";
}

struct GroupedFp8Gemm {
    // Activations: e4m3 [n_pad, in] in padded rows; expert e's rows start at pfirst[e] and its
    // scales form one [in/128][m4_e] block at xs + pfirst[e] · in/128.
    const void* x = nullptr;
    const float* xs = nullptr;
    int64_t n_pad = 0;                // pfirst[E], as the host knows it
    const int32_t* pfirst = nullptr;  // device [E + 1]
    int n_experts = 0;
    // Weights: e4m3 [E][out][in] with 128×128 tile scales (Fp8Blocks::Tile128) per expert,
    // expert e's at ws + e · ws_per_expert.
    const void* w = nullptr;
    const float* ws = nullptr;
    int64_t ws_per_expert = 0;
    // Set: the last expert (n_experts − 1: the shared expert, whose weights are held apart from
    // the routed ones) takes its e4m3 [out][in] and Tile128 scales from here, and w / ws hold the
    // other n_experts − 1.
    const void* w_last = nullptr;
    const float* ws_last = nullptr;
    int64_t in = 0, out = 0;     // multiples of 128
    __nv_bfloat16* y = nullptr;  // [n_pad, out]: every padded row of every expert is written
    // TmaStore, the faster on the H200 (docs/fp8.md: 1,269 / 1,225 TFLOP/s against 1,142 / 957 at
    // the V4-Flash expert shapes); it needs y 16-byte aligned. Registers stays as the measured
    // baseline of bench/fp8_gemm_bench and the reference its tests compare bits against.
    GroupedFp8Epilogue epilogue = GroupedFp8Epilogue::TmaStore;
};

// Whether this GPU runs the kernel (compute capability 9.0: wgmma and TMA as built, sm_90a).
bool grouped_fp8_supported();

void grouped_gemm_fp8(const GroupedFp8Gemm& g, cudaStream_t stream);

// The output tile of grouped_gemm_bf16: Wide, 128 rows × 256 outputs (the fp8 path's); Tall, 256
// rows × 128 outputs, each consumer warpgroup two 64 × 128 parts (rows 64·cw … and 128 + 64·cw …).
// With Tall an expert of up to 256 rows has one row tile and its weights are read once, where
// Wide's two row tiles of a 192-row expert (8k tokens over 256 experts, top-6) each read them; a
// part whose 64 rows are all past the expert's issues no MMAs. Auto: Tall when the experts have at
// most kGroupedBf16TallMaxMeanRows rows on average, else Wide (docs/fp8.md, "Tall tiles for bf16
// experts of few rows": measured, and why fp8 keeps the wide tiles).
enum class GroupedBf16Tile { Auto, Wide, Tall };
constexpr int64_t kGroupedBf16TallMaxMeanRows = 256;

// bf16 experts through the same kernel (docs/fp8.md, "bf16 experts in the grouped kernel"): for
// every expert e, y[first[e] … first[e + 1]) = x[those rows] · w_eᵀ, rows dense in the order of
// gather_by_expert (no padding), w bf16 [E][out][in], fp32 accumulation over all of K in the MMAs'
// accumulators, bf16 out by the register epilogue (each row of y written by its own expert only;
// a TMA-store epilogue for dense rows measured no faster: docs/fp8.md).
// Compute capability 9.0 (grouped_fp8_supported); x, w and y 16-byte aligned.
struct GroupedBf16Gemm {
    const __nv_bfloat16* x = nullptr;  // [rows, in]
    int64_t rows = 0;                  // first[E], as the host knows it
    const int32_t* first = nullptr;    // device [E + 1]
    int n_experts = 0;
    const __nv_bfloat16* w = nullptr;  // [E][out][in]
    int64_t in = 0, out = 0;           // in a multiple of 64, out of 128
    __nv_bfloat16* y = nullptr;        // [rows, out]
    GroupedBf16Tile tile = GroupedBf16Tile::Auto;
};

void grouped_gemm_bf16(const GroupedBf16Gemm& g, cudaStream_t stream);

// The tile grouped_gemm_bf16 uses for g (Auto resolved).
GroupedBf16Tile grouped_bf16_tile(const GroupedBf16Gemm& g);

}  // namespace cpfill::ops::cuda
