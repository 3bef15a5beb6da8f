// make_batch: validation at the boundary, then flattening.
#include "model/batch.h"

#include "core/error.h"

namespace cpfill {

Batch make_batch(const std::vector<std::vector<int32_t>>& requests, int64_t vocab_size) {
    CPFILL_CHECK(!requests.empty(), "the batch holds no request: expected at least one prompt");
    Batch b;
    b.request_start.push_back(0);
    for (size_t r = 0; r < requests.size(); ++r) {
        const auto& ids = requests[r];
        CPFILL_CHECK(!ids.empty(), "request {} is an empty prompt: expected at least one token", r);
        for (size_t p = 0; p < ids.size(); ++p) {
            CPFILL_CHECK(ids[p] >= 0 && ids[p] < vocab_size,
                         "request {} token {} has id {}: expected 0 <= id < vocab_size {}", r, p,
                         ids[p], vocab_size);
            b.tokens.push_back(ids[p]);
            b.request.push_back(static_cast<int32_t>(r));
            b.pos.push_back(static_cast<int64_t>(p));
        }
        b.request_start.push_back(b.n_tokens());
    }
    return b;
}

}  // namespace cpfill
