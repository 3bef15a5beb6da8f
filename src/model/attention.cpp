// attention_forward: local projections, per-request compressor pooling, per-query attention.
#include "model/attention.h"

#include <cmath>
#include <cstring>

#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/norm.h"

namespace cpfill {

RopeTables::RopeTables(const ModelConfig& cfg)
    : main(cfg.rope_main, cfg.rope_dim), compress(cfg.rope_compress, cfg.rope_dim) {}

namespace {

// Pools every complete window of each request into `entries` [n_entries, dim] of its store:
// projections, pooling, kv_norm, RoPE at the window's first position.
void compress_requests(const CompressorWeights& W, const ModelConfig& cfg,
                       const ops::RopeTable& rope, const Batch& b, const float* xn, int ratio,
                       int64_t dim, bool overlap, std::vector<LayerKv>& kv, bool index_keys,
                       ThreadPool& pool) {
    const int64_t n = b.n_tokens(), D = cfg.d_model, width = overlap ? 2 * dim : dim;
    std::vector<float> c(n * width), z(n * width);
    ops::linear(pool, xn, n, D, W.wkv.f32(), width, c.data());
    ops::linear(pool, xn, n, D, W.wgate.f32(), width, z.data());
    const ops::PoolSpec spec{ratio, dim, overlap};
    for (int r = 0; r < b.n_requests(); ++r) {
        const int64_t start = b.request_start[r], n_entries = b.request_len(r) / ratio;
        std::vector<float>& dst = index_keys ? kv[r].index_keys : kv[r].entries;
        dst.assign(n_entries * dim, 0.0f);
        ops::compress_pool(spec, c.data() + start * width, z.data() + start * width, 0, W.ape.f32(),
                           0, n_entries, dst.data());
        ops::rmsnorm(dst.data(), n_entries, dim, W.norm.f32(), static_cast<float>(cfg.norm_eps),
                     dst.data());
        std::vector<int64_t> pos(n_entries);
        for (int64_t w = 0; w < n_entries; ++w) pos[w] = w * ratio;
        ops::apply_rope(rope, dst.data(), n_entries, dim, 1, static_cast<int>(dim), pos.data(),
                        false);
        kv[r].n_entries = n_entries;
    }
}

}  // namespace

void attention_forward(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
                       const Batch& b, const float* xn, std::vector<LayerKv>& kv, float* out,
                       int32_t* topk, ThreadPool& pool) {
    const int64_t n = b.n_tokens(), D = cfg.d_model;
    const int H = cfg.n_heads, d = cfg.head_dim;
    const int64_t Hd = static_cast<int64_t>(H) * d;
    const float eps = static_cast<float>(cfg.norm_eps);
    const AttentionWeights& A = L.attn;
    const ops::RopeTable& rope = ropes.for_layer(L.type);

    // Queries: c_q = q_norm(x·wq_a), q = rope(rmsnorm_per_head(c_q·wq_b)).
    std::vector<float> cq(n * cfg.q_rank), q(n * Hd);
    ops::linear(pool, xn, n, D, A.wq_a.f32(), cfg.q_rank, cq.data());
    ops::rmsnorm(cq.data(), n, cfg.q_rank, A.q_norm.f32(), eps, cq.data());
    ops::linear(pool, cq.data(), n, cfg.q_rank, A.wq_b.f32(), Hd, q.data());
    ops::rmsnorm(q.data(), n * H, d, nullptr, eps, q.data());
    ops::apply_rope(rope, q.data(), n, Hd, H, d, b.pos.data(), false);

    // Window keys: kv = rope(kv_norm(x·wkv)), stored per request in position order.
    std::vector<float> k(n * d);
    ops::linear(pool, xn, n, D, A.wkv.f32(), d, k.data());
    ops::rmsnorm(k.data(), n, d, A.kv_norm.f32(), eps, k.data());
    ops::apply_rope(rope, k.data(), n, d, 1, d, b.pos.data(), false);
    for (int r = 0; r < b.n_requests(); ++r) {
        const float* src = k.data() + b.request_start[r] * d;
        kv[r].window.assign(src, src + b.request_len(r) * d);
        kv[r].entries.clear();
        kv[r].index_keys.clear();
        kv[r].n_entries = 0;
    }

    const bool csa = L.type == AttnType::CSA;
    const int ratio = L.type == AttnType::CSA ? cfg.csa_ratio : cfg.hca_ratio;
    if (L.type != AttnType::Sliding)
        compress_requests(A.compressor, cfg, rope, b, xn, ratio, d, csa, kv, false, pool);

    // Indexer queries and head weights (CSA).
    const int nI = cfg.index_n_heads, dI = cfg.index_head_dim;
    std::vector<float> qI, wI;
    if (csa) {
        compress_requests(A.idx_compressor, cfg, rope, b, xn, ratio, dI, true, kv, true, pool);
        qI.resize(n * nI * dI);
        wI.resize(n * nI);
        ops::linear(pool, cq.data(), n, cfg.q_rank, A.idx_wq_b.f32(), int64_t{nI} * dI, qI.data());
        ops::apply_rope(rope, qI.data(), n, int64_t{nI} * dI, nI, dI, b.pos.data(), false);
        ops::linear(pool, xn, n, D, A.idx_weights_proj.f32(), nI, wI.data());
        const float ws = 1.0f / std::sqrt(static_cast<float>(nI));
        for (float& v : wI) v *= ws;
    }

    // Attention of every query over its window and its compressed entries.
    std::vector<float> o(n * Hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float idx_scale = 1.0f / std::sqrt(static_cast<float>(dI));
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
        std::vector<float> scratch, idx_scratch;
        std::vector<int32_t> sel(csa ? cfg.index_topk : 0);
        for (int64_t t = begin; t < end; ++t) {
            const LayerKv& st = kv[b.request[t]];
            const int64_t p = b.pos[t];
            ops::AttnKeys keys;
            const int64_t w0 = std::max<int64_t>(0, p - cfg.window + 1);
            keys.window = st.window.data() + w0 * d;
            keys.n_window = p - w0 + 1;
            if (L.type != AttnType::Sliding) {
                const int64_t eligible = std::min((p + 1) / ratio, st.n_entries);
                keys.entries = st.entries.data();
                keys.n_entries = eligible;
                if (csa) {
                    idx_scratch.resize((nI + 1) * std::max<int64_t>(eligible, 1));
                    keys.n_entries = ops::indexer_select(
                        qI.data() + t * nI * dI, wI.data() + t * nI, nI, dI, st.index_keys.data(),
                        eligible, cfg.index_topk, idx_scale, sel.data(), idx_scratch.data());
                    keys.entry_idx = sel.data();
                    if (topk) std::copy(sel.begin(), sel.end(), topk + t * cfg.index_topk);
                }
            }
            scratch.resize((H + d) * (keys.n_window + keys.n_entries));
            ops::attend_one(q.data() + t * Hd, H, d, keys, A.sink.f32(), scale, o.data() + t * Hd,
                            scratch.data());
        }
    });
    if (topk && !csa) std::fill(topk, topk + n * cfg.index_topk, -1);

    // De-rotate the rope slice at the query position, then the grouped output projection.
    ops::apply_rope(rope, o.data(), n, Hd, H, d, b.pos.data(), true);
    const int g = cfg.o_groups;
    const int64_t group_in = Hd / g, ro = cfg.o_rank;
    std::vector<float> y(n * g * ro);
    for (int gi = 0; gi < g; ++gi)
        ops::linear(pool, o.data() + gi * group_in, n, group_in, Hd,
                    A.wo_a.f32() + gi * ro * group_in, ro, y.data() + gi * ro, g * ro);
    ops::linear(pool, y.data(), n, g * ro, A.wo_b.f32(), D, out);
}

}  // namespace cpfill
