// Lightning-indexer scoring and top-k (docs/architecture.md §3.7, steps 4–5), fp32 as in HF.
#pragma once

#include <cstdint>

namespace cpfill::ops {

// For one query: score[w] = Σ_h weight[h] · ReLU(q[h] · key[w]) · scale for w < n_eligible, then
// the indices of the min(top_k, n_eligible) largest scores (descending; ties → lower index first)
// written to idx[0 … top_k), the rest −1. q: [n_heads, dim], keys: [≥ n_eligible, dim],
// weight: [n_heads] (already scaled by n_heads^−½). scratch: ≥ n_heads·n_eligible + n_eligible.
// Returns the number of selected entries.
int64_t indexer_select(const float* q, const float* weight, int n_heads, int64_t dim,
                       const float* keys, int64_t n_eligible, int64_t top_k, float scale,
                       int32_t* idx, float* scratch);

}  // namespace cpfill::ops
