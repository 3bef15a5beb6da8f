// Shared-KV attention of one query over its window keys and chosen compressed entries, with a
// per-head sink in the softmax denominator (docs/architecture.md §3.4 steps 4–7). K = V.
#pragma once

#include <cstdint>

namespace cpfill::ops {

struct AttnKeys {
    const float* window = nullptr;  // [n_window, head_dim] consecutive window keys
    int64_t n_window = 0;
    const float* entries = nullptr;      // [*, head_dim] compressed entries
    const int32_t* entry_idx = nullptr;  // rows of `entries` to use; nullptr = rows 0 … n_entries−1
    int64_t n_entries = 0;
};

// q: [n_heads, head_dim] → out: [n_heads, head_dim]. sinks: [n_heads]. scratch: ≥
// n_heads · (n_window + n_entries) + head_dim · n_entries floats.
void attend_one(const float* q, int n_heads, int64_t head_dim, const AttnKeys& keys,
                const float* sinks, float scale, float* out, float* scratch);

}  // namespace cpfill::ops
