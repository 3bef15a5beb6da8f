// cpu_prefill_bytes: the CPU backend's buffers by size (see cp_prefill.h), in floats per row.
#include <algorithm>

#include "model/batch.h"
#include "model/kv_store.h"
#include "parallel/cp_prefill.h"
#include "parallel/layout.h"

namespace cpfill {

size_t cpu_prefill_bytes(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& requests,
                         const PrefillOptions& opt) {
    const int C = std::max(1, opt.cp);
    const int64_t D = cfg.d_model, hc = cfg.hc, d = cfg.head_dim, Hd = int64_t{cfg.n_heads} * d;
    const int64_t nI = cfg.index_n_heads, dI = cfg.index_head_dim, K = cfg.top_k;
    const int64_t width = (cfg.moe_dim + C - 1) / C;  // a rank's expert slice (the widest)
    int64_t packed = 0;                               // widest packed attention input of a layer
    for (AttnType t : cfg.layer_types) packed = std::max(packed, packed_widths(cfg, t).total());
    const int64_t gathered = std::max({packed, D, opt.record_hidden ? hc * D : int64_t{0}});

    // Per local row (n of them on a rank): the residual stream and its scratch, the attention's
    // queries and outputs, and the send halves of the gathers.
    const int64_t per_local = 2 * hc * D + 2 * D + (3 + hc) * hc + hc * hc +        // Sub
                              cfg.q_rank + 2 * Hd + nI * dI + nI +                  // AttnScratch
                              int64_t{cfg.o_groups} * cfg.o_rank + packed + 2 * D;  // sends, recv
    // Per row of the whole batch (T of them on every rank): the gathered rows and the attention
    // gather's receive buffer, the MoE gather and reduce-scatter buffers, and moe_forward over
    // all rows (router, the largest expert's rows, the shared expert).
    const int64_t per_global =
        gathered + packed + 2 * D + cfg.n_experts + 6 * K + (2 * D + 3 * width) + (D + 3 * width);
    // Per token of the prompt, in every rank's KV store: window keys of every position, and the
    // compressed entries and indexer keys; doubled for vector growth.
    int64_t per_token_kv = 0;
    for (AttnType t : cfg.layer_types) {
        per_token_kv += d;
        if (t == AttnType::CSA) per_token_kv += (d + dI) / cfg.csa_ratio + 1;
        if (t == AttnType::HCA) per_token_kv += d / cfg.hca_ratio + 1;
    }
    per_token_kv *= 2;

    int64_t total_tokens = 0, largest_padded = 0;
    for (const auto& r : requests) total_tokens += static_cast<int64_t>(r.size());
    for (const Batch& b : make_chunks(requests, opt.chunk))
        largest_padded = std::max(largest_padded, make_layout(b, C).padded);
    const int64_t local = largest_padded / C;
    const int64_t per_rank =
        local * per_local + largest_padded * per_global + total_tokens * per_token_kv;
    int64_t outputs = 0;  // rank 0's logits and records
    for (const auto& r : requests)
        outputs += (opt.all_logits ? static_cast<int64_t>(r.size()) : 1) * cfg.vocab_size;
    if (opt.record_hidden) outputs += (cfg.n_layers + 1) * total_tokens * hc * D + total_tokens * D;
    if (opt.record_topk) outputs += cfg.n_layers * total_tokens * cfg.index_topk;
    return static_cast<size_t>(C * per_rank + outputs) * sizeof(float);
}

}  // namespace cpfill
