// Context-parallel token layout (docs/design.md §4): a batch of T tokens, padded at the end to a
// multiple of C, dealt round-robin — token t lives on rank t mod C at local row t div C. Pad rows
// take positions after their request's last token, so no real token ever sees them.
#pragma once

#include <cstdint>
#include <vector>

#include "model/attention.h"
#include "model/batch.h"

namespace cpfill {

struct CpLayout {
    int cp_size = 1;
    int64_t n_tokens = 0;  // real tokens T
    int64_t padded = 0;    // T rounded up to a multiple of cp_size
    int64_t local() const { return padded / cp_size; }
    // Rows of rank `rank`: global rows rank, rank + C, rank + 2C, …
    Rows local_rows(const Batch& b, int rank) const;
    // Token ids of all padded rows in rank-major (all-gather) order: [padded].
    std::vector<int32_t> rank_major_tokens(const Batch& b) const;
};

CpLayout make_layout(const Batch& b, int cp_size);

// An all-gather returns rows rank-major: row k·(T/C) + j holds token j·C + k. Writes the first
// `rows` rows of global order into out [rows, width] (one strided copy).
void rerange(const float* gathered, int cp_size, int64_t per_rank, int64_t width, int64_t rows,
             float* out);

}  // namespace cpfill
