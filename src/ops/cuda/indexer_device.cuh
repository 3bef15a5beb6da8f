// Device helpers shared by the indexer's scoring kernels (indexer.cu, indexer_fp8.cu) and its
// top-k.
#pragma once

#include <cstdint>

namespace cpfill::ops::cuda {

// Entries a query at position p may select: min((p + 1) / ratio, n_entries) (ops/indexer.h).
__device__ __forceinline__ int64_t n_eligible(int64_t p, int ratio, int64_t n_entries) {
    const int64_t e = (p + 1) / ratio;
    return e < n_entries ? e : n_entries;
}

}  // namespace cpfill::ops::cuda
