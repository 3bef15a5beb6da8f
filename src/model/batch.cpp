// Batch construction: validation at the boundary, chunking, and the two-batch split.
#include "model/batch.h"

#include <cstdlib>

#include "core/error.h"

namespace cpfill {

void Batch::add_segment(int req, int64_t pos0, const int32_t* ids, int64_t len) {
    segments.push_back({req, pos0, len, n_tokens()});
    for (int64_t i = 0; i < len; ++i) {
        tokens.push_back(ids[i]);
        request.push_back(req);
        pos.push_back(pos0 + i);
    }
}

void validate_requests(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size) {
    CPFILL_CHECK(!requests.empty(), "the batch holds no request: expected at least one prompt");
    for (size_t r = 0; r < requests.size(); ++r) {
        const auto& ids = requests[r];
        CPFILL_CHECK(!ids.empty(), "request {} is an empty prompt: expected at least one token", r);
        for (size_t p = 0; p < ids.size(); ++p)
            CPFILL_CHECK(ids[p] >= 0 && ids[p] < vocab_size,
                         "request {} token {} has id {}: expected 0 <= id < vocab_size {}", r, p,
                         ids[p], vocab_size);
    }
}

Batch make_batch(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size) {
    validate_requests(requests, vocab_size);
    Batch b;
    for (size_t r = 0; r < requests.size(); ++r)
        b.add_segment(static_cast<int>(r), 0, requests[r].data(),
                      static_cast<int64_t>(requests[r].size()));
    return b;
}

std::vector<Batch> make_chunks(const std::vector<std::vector<int32_t>>& requests, int64_t chunk) {
    std::vector<Batch> out(1);
    for (size_t r = 0; r < requests.size(); ++r) {
        const int64_t len = static_cast<int64_t>(requests[r].size());
        int64_t p = 0;
        while (p < len) {
            if (chunk > 0 && out.back().n_tokens() == chunk) out.emplace_back();
            int64_t room = chunk > 0 ? chunk - out.back().n_tokens() : len - p;
            int64_t n = std::min(room, len - p);
            out.back().add_segment(static_cast<int>(r), p, requests[r].data() + p, n);
            p += n;
        }
    }
    return out;
}

std::pair<Batch, Batch> split_in_two(const Batch& b) {
    const int64_t n = b.n_tokens(), mid = n / 2;
    int64_t cut = mid;
    int64_t best = -1;
    for (const Segment& s : b.segments)  // nearest segment boundary to the middle
        if (s.row0 > 0 && (best < 0 || std::llabs(s.row0 - mid) < std::llabs(best - mid)))
            best = s.row0;
    if (best >= 0 && std::llabs(best - mid) <= n / 8) cut = best;
    Batch a, c;
    for (const Segment& s : b.segments) {
        const int32_t* ids = b.tokens.data() + s.row0;
        const int64_t end = s.row0 + s.len;
        if (end <= cut) {
            a.add_segment(s.request, s.pos0, ids, s.len);
        } else if (s.row0 >= cut) {
            c.add_segment(s.request, s.pos0, ids, s.len);
        } else {
            const int64_t first = cut - s.row0;
            a.add_segment(s.request, s.pos0, ids, first);
            c.add_segment(s.request, s.pos0 + first, ids + first, s.len - first);
        }
    }
    return {std::move(a), std::move(c)};
}

}  // namespace cpfill
