// Hopper PTX for the grouped expert GEMM (grouped_fp8.cu): mbarriers, the bulk tensor copy (TMA)
// into shared memory and back out to global memory (bulk async-groups), warpgroup MMAs (wgmma,
// sm_90a) of e4m3 or bf16 operands from shared memory, stmatrix and named barriers. Shared tiles
// are K-major rows of 128 bytes in the 128-byte swizzle that TMA writes and wgmma reads.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ops/cuda/ptx.cuh"

namespace cpfill::ops::cuda {

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

// Makes initialised mbarriers visible to the async proxy (TMA) before any thread uses them.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// Box (c0 = inner coordinate, c1 = row) of a 2-D tensor map → shared memory; completes bytes on
// bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%3, "
        "%4}], [%2];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

// Box (c0 = inner coordinate, c1, c2 = outermost) of a 3-D tensor map → shared memory; completes
// bytes on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Box of a 2-D tensor map at (c0 = inner coordinate, c1 = row) ← shared memory at src, as one
// operation of this thread's current bulk async-group (bulk_commit closes the group).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
            reinterpret_cast<uint64_t>(map)),
        "r"(src), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's bulk async-groups still read their shared memory
// (the source may be overwritten after it; the global writes may still be under way).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until at most kPending of this thread's bulk async-groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Makes this thread's generic-proxy writes to shared memory visible to the async proxy (TMA).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barrier `id` (not 0: __syncthreads) of `count` threads, a multiple of 32. The unaligned
// form: the warps need not be converged when they reach it.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Four 8 × 8 b16 matrices → shared memory: register i of lane t holds row t/4, columns 2·(t%4)
// (low half) and +1 of matrix i (the mma accumulator layout); lanes 8i … 8i + 7 give the 16-byte
// aligned addresses of matrix i's rows 0 … 7.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// wgmma shared-memory descriptor of a tile in the 128-byte swizzle (rows of 128 bytes, 8-row atoms
// 1024 bytes apart: the stride byte offset; the atoms' base 1024-byte aligned). K-major: the
// leading byte offset is unused (wgmma_desc_sw128). MN-major: lbo is the distance between atoms
// along MN (the next 64 bf16 of a row of MN), and the 1024-byte stride is between groups of 8 rows
// along K.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_lbo(uint32_t addr, uint32_t lbo) {
    return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t{(lbo & 0x3FFFF) >> 4} << 16) |
           (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
    return wgmma_desc_sw128_lbo(addr, 16);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups of this warp are still in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The accumulator operands of the m64nN wgmma wrappers below, spelt once: the register list of
// the instruction, "{%0, …, %(N/2 − 1)}", and the "+f"(d[i]) operands that bind it (N/2 = 64 or
// 128 fp32 a thread), so a wrapper's other operands are numbered from N/2. The 128-value forms are
// the 64-value ones twice (d + 64: the second half of the accumulator).
#define CPFILL_WGMMA_R0_63                                                                  \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CPFILL_WGMMA_R64_127                                                                     \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
    "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, " \
    "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define CPFILL_WGMMA_D64_REGS "{" CPFILL_WGMMA_R0_63 "}"
#define CPFILL_WGMMA_D128_REGS "{" CPFILL_WGMMA_R0_63 ", " CPFILL_WGMMA_R64_127 "}"
#define CPFILL_WGMMA_D64_OUT(d)                                                                   \
    "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),           \
        "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]),     \
        "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]), \
        "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]), \
        "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]), \
        "+f"((d)[30]), "+f"((d)[31]), "+f"((d)[32]), "+f"((d)[33]), "+f"((d)[34]), "+f"((d)[35]), \
        "+f"((d)[36]), "+f"((d)[37]), "+f"((d)[38]), "+f"((d)[39]), "+f"((d)[40]), "+f"((d)[41]), \
        "+f"((d)[42]), "+f"((d)[43]), "+f"((d)[44]), "+f"((d)[45]), "+f"((d)[46]), "+f"((d)[47]), \
        "+f"((d)[48]), "+f"((d)[49]), "+f"((d)[50]), "+f"((d)[51]), "+f"((d)[52]), "+f"((d)[53]), \
        "+f"((d)[54]), "+f"((d)[55]), "+f"((d)[56]), "+f"((d)[57]), "+f"((d)[58]), "+f"((d)[59]), \
        "+f"((d)[60]), "+f"((d)[61]), "+f"((d)[62]), "+f"((d)[63])
#define CPFILL_WGMMA_D128_OUT(d) CPFILL_WGMMA_D64_OUT(d), CPFILL_WGMMA_D64_OUT((d) + 64)

// Keeps the compiler from moving accesses of v across the asynchronous MMAs.
__device__ __forceinline__ void reg_fence(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// reg_fence on every value of an accumulator array: one-dimensional, or [parts][values] taken
// value by value across the parts (the order the grouped kernel's loops had, kept so that its code
// did not change).
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(v[i]);
}
template <int P, int N>
__device__ __forceinline__ void reg_fence_all(float (&v)[P][N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int p = 0; p < P; ++p) reg_fence(v[p][i]);
}

// d[64×128] (+)= a[64×32] · b[128×32]ᵀ, e4m3 from shared memory, fp32 accumulators in the wgmma
// fragment layout (thread t of the warpgroup: rows 16·(t/32) + (t%32)/4 (+8), columns
// 8·i + 2·(t%4) (+1) of d[4i..4i+3]). accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t a, uint64_t b,
                                                      int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " CPFILL_WGMMA_D64_REGS
        ", %64, %65, p, 1, 1;\n"
        "}\n"
        : CPFILL_WGMMA_D64_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

// d[64×128] (+)= a[64×16] · b[128×16]ᵀ, bf16 from shared memory (K-major, no transpose), fp32
// accumulators in the layout of wgmma_m64n128k32_e4m3. A k16 step is 32 bytes of a row, as a k32
// step of e4m3 is, so the same descriptors walk both.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t a, uint64_t b,
                                                      int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CPFILL_WGMMA_D64_REGS
        ", %64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : CPFILL_WGMMA_D64_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

// d[64×256] (+)= a[64×16] · b[256×16]ᵀ, bf16 from shared memory (K-major), fp32 accumulators:
// d[0 … 63] hold output columns 0 … 127 and d[64 … 127] columns 128 … 255, each half in the layout
// of wgmma_m64n128k32_e4m3. One instruction reads A once for all 256 columns. kTransB = 1: b is
// MN-major instead (rows of b = K, the 256 columns contiguous in 64-column atoms; the descriptor's
// leading byte offset is the distance between atoms, wgmma_desc_sw128_lbo).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t a, uint64_t b,
                                                      int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " CPFILL_WGMMA_D128_REGS
        ", %128, %129, p, 1, 1, 0, %131;\n"
        "}\n"
        : CPFILL_WGMMA_D128_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
}

// The registers per thread of this warpgroup from here on (a multiple of 8, 24 … 256): give some
// back (dec) so that another warpgroup of the block can take them (inc, which waits for them).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void setmaxnreg_dec40() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
}
__device__ __forceinline__ void setmaxnreg_inc232() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
}

}  // namespace cpfill::ops::cuda
