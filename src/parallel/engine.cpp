// The stage alternation of two-batch overlap over chunks and layers (engine.h).
#include "parallel/engine.h"

namespace cpfill {

void run_chunk(RankBackend& b, const ChunkPlan& chunk, int n_layers) {
    b.begin_chunk(chunk);
    const int subs = static_cast<int>(chunk.subs.size());
    for (int s = 0; s < subs; ++s) b.embedded(s);
    for (int li = 0; li < n_layers; ++li) {
        b.begin_layer(li);
        for (int s = 0; s < subs; ++s) attention_stage(b, s, li);
        for (int s = 0; s < subs; ++s) moe_stage(b, s, li);
    }
    if (n_layers > 0)
        for (int s = 0; s < subs; ++s) moe_finish(b, s, n_layers - 1, false);
    b.begin_head();
    for (int s = 0; s < subs; ++s) b.head(s);
    b.end_chunk();
}

void run_plan(RankBackend& b, const RunPlan& plan, int n_layers) {
    for (const ChunkPlan& c : plan.chunks) run_chunk(b, c, n_layers);
}

}  // namespace cpfill
