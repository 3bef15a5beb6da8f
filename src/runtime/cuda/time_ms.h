// Timing of GPU work for benchmarks and the GPU tests' information lines: milliseconds per call of
// a function that launches on the legacy default stream, between CUDA events.
#pragma once

#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

// Mean milliseconds of fn() over `reps` calls after one warm-up call.
template <class F>
double time_ms(F&& fn, int reps = 5) {
    fn();
    cudaEvent_t a, b;
    CPFILL_CUDA_CHECK(cudaEventCreate(&a));
    CPFILL_CUDA_CHECK(cudaEventCreate(&b));
    CPFILL_CUDA_CHECK(cudaEventRecord(a, nullptr));
    for (int i = 0; i < reps; ++i) fn();
    CPFILL_CUDA_CHECK(cudaEventRecord(b, nullptr));
    CPFILL_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CPFILL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

}  // namespace cpfill::cuda
