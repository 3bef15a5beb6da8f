// A batch of token segments flattened into one sequence (docs/design.md §4). A segment is a run of
// consecutive positions of one request; a request may continue a segment processed earlier
// (chunked prefill, the second half of a two-batch-overlap split), whose keys are then already in
// the KV store. Every row keeps its request id and its position inside the request.
#pragma once

#include <cstdint>
#include <vector>

namespace cpfill {

struct Segment {
    int request = 0;   // index into the caller's list of requests
    int64_t pos0 = 0;  // position (inside the request) of the segment's first token
    int64_t len = 0;
    int64_t row0 = 0;  // first row of the segment in the flattened batch
};

struct Batch {
    std::vector<int32_t> tokens;   // [n_tokens] token ids
    std::vector<int32_t> request;  // [n_tokens] request index
    std::vector<int64_t> pos;      // [n_tokens] position inside the request
    std::vector<Segment> segments;
    int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
    void add_segment(int request, int64_t pos0, const int32_t* ids, int64_t len);
};

// Validates requests (non-empty, ids in [0, vocab_size)); throws naming the request and position.
void validate_requests(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size);

// All requests whole, one after another.
Batch make_batch(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size);

// The flattened token stream of all requests cut into batches of at most `chunk` tokens
// (chunk <= 0: one batch). Segments of one request in later batches continue earlier ones.
std::vector<Batch> make_chunks(const std::vector<std::vector<int32_t>>& requests, int64_t chunk);

// Splits a batch into two with about equal token counts: at a segment boundary when one lies
// within 1/8 of the middle, otherwise inside the segment that holds the middle token.
std::pair<Batch, Batch> split_in_two(const Batch& b);

}  // namespace cpfill
