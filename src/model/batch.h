// A batch of requests flattened into one token sequence (design.md §4): request after request,
// each token with its request id and its position inside the request.
#pragma once

#include <cstdint>
#include <vector>

namespace cpfill {

struct Batch {
    std::vector<int32_t> tokens;         // [n_tokens] token ids
    std::vector<int32_t> request;        // [n_tokens] request index
    std::vector<int64_t> pos;            // [n_tokens] position inside the request
    std::vector<int64_t> request_start;  // [n_requests + 1] first flattened row of each request
    int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
    int n_requests() const { return static_cast<int>(request_start.size()) - 1; }
    int64_t request_len(int r) const { return request_start[r + 1] - request_start[r]; }
};

// Flattens requests; throws naming the request and position on an empty request or a token id
// outside [0, vocab_size).
Batch make_batch(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size);

}  // namespace cpfill
