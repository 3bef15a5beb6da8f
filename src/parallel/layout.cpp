// Round-robin layout and the rank-major → global-order rerange.
#include "parallel/layout.h"

#include <cstring>

#include "core/error.h"

namespace cpfill {

CpLayout make_layout(const Batch& b, int cp_size) {
    CPFILL_CHECK(cp_size >= 1, "cp size must be at least 1, found {}", cp_size);
    CpLayout l;
    l.cp_size = cp_size;
    l.n_tokens = b.n_tokens();
    l.padded = (l.n_tokens + cp_size - 1) / cp_size * cp_size;
    return l;
}

Rows CpLayout::local_rows(const Batch& b, int rank) const {
    Rows r;
    const int64_t last = n_tokens - 1;
    for (int64_t t = rank; t < padded; t += cp_size) {
        const bool real = t < n_tokens;
        r.tokens.push_back(real ? b.tokens[t] : 0);
        r.request.push_back(b.request[real ? t : last]);
        r.pos.push_back(real ? b.pos[t] : b.pos[last] + (t - last));
        r.valid.push_back(real ? 1 : 0);
    }
    return r;
}

std::vector<int32_t> CpLayout::rank_major_tokens(const Batch& b) const {
    std::vector<int32_t> out(padded, 0);
    const int64_t per = local();
    for (int k = 0; k < cp_size; ++k)
        for (int64_t j = 0; j < per; ++j) {
            const int64_t t = j * cp_size + k;
            out[k * per + j] = t < n_tokens ? b.tokens[t] : 0;
        }
    return out;
}

void rerange(const float* gathered, int cp_size, int64_t per_rank, int64_t width, int64_t rows,
             float* out) {
    for (int64_t t = 0; t < rows; ++t) {
        const int64_t k = t % cp_size, j = t / cp_size;
        std::memcpy(out + t * width, gathered + (k * per_rank + j) * width, width * sizeof(float));
    }
}

}  // namespace cpfill
