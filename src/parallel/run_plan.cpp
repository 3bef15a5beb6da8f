// make_run_plan: chunks, then each chunk's TBO split (run_plan.h).
#include "parallel/run_plan.h"

#include <algorithm>

namespace cpfill {

bool RunPlan::tbo() const {
    return std::any_of(chunks.begin(), chunks.end(), [](const ChunkPlan& c) { return c.tbo; });
}

bool gpu_tbo_rule(const ModelConfig& cfg, int64_t n_tokens, int cp) {
    return gpu_tbo_pays(cfg, n_tokens, cp);
}

RunPlan make_run_plan(const std::vector<std::vector<int32_t>>& requests, const ModelConfig& cfg,
                      int cp, TboMode tbo, int64_t chunk, TboRule rule) {
    validate_requests(requests, cfg.vocab_size);
    RunPlan p;
    p.requests = &requests;
    p.chunk = chunk > 0 ? chunk : 0;
    std::vector<Batch> batches = make_chunks(requests, p.chunk);
    if (batches.size() == 1) p.chunk = 0;  // one chunk is one pass
    for (Batch& b : batches) {
        ChunkPlan c;
        c.stream_row0 = p.n_tokens;
        const int64_t T = b.n_tokens();
        p.n_tokens += T;
        c.tbo = tbo == TboMode::On || (tbo == TboMode::Auto && rule(cfg, T, cp));
        if (T < 2) c.tbo = false;  // nothing to split
        if (c.tbo) {
            auto [x, y] = split_in_two(b);
            c.row_offset = {0, x.n_tokens()};
            c.subs.push_back(std::move(x));
            c.subs.push_back(std::move(y));
        } else {
            c.subs.push_back(b);
            c.row_offset = {0};
        }
        c.batch = std::move(b);
        p.chunks.push_back(std::move(c));
    }
    return p;
}

}  // namespace cpfill
