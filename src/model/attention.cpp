// Attention stages: projections (pack, queries) on local rows and per-query attention.
#include "model/attention.h"

#include <cmath>
#include <cstring>

#include "ops/act_rounding.h"
#include "ops/attention.h"
#include "ops/indexer.h"
#include "ops/indexer_round.h"
#include "ops/linear.h"
#include "ops/norm.h"

namespace cpfill {

RopeTables::RopeTables(const ModelConfig& cfg)
    : main(cfg.rope_main, cfg.rope_dim), compress(cfg.rope_compress, cfg.rope_dim) {}

void attn_pack(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
               const Rows& rows, const float* xn, float* packed, ThreadPool& pool) {
    const int64_t n = rows.n(), D = cfg.d_model, d = cfg.head_dim;
    const PackedWidths w = packed_widths(cfg, L.type);
    const int64_t ld = w.total();
    const AttentionWeights& A = L.attn;
    // Window key: rope(kv_norm(x · wkv)).
    ops::linear_act(pool, L.activations, xn, n, D, D, A.wkv.f32(), d, packed, ld);
    for (int64_t t = 0; t < n; ++t)
        ops::rmsnorm(packed + t * ld, 1, d, A.kv_norm.f32(), static_cast<float>(cfg.norm_eps),
                     packed + t * ld);
    ops::apply_rope(ropes.for_layer(L.type), packed, n, ld, 1, static_cast<int>(d), rows.pos.data(),
                    false);
    // Compressor projections C, Z (main; and the indexer's in CSA layers), pooled later.
    if (w.comp) {
        ops::linear(pool, xn, n, D, D, A.compressor.wkv.f32(), w.comp, packed + w.key, ld);
        ops::linear(pool, xn, n, D, D, A.compressor.wgate.f32(), w.comp, packed + w.key + w.comp,
                    ld);
    }
    if (w.index) {
        const int64_t off = w.key + 2 * w.comp;
        ops::linear(pool, xn, n, D, D, A.idx_compressor.wkv.f32(), w.index, packed + off, ld);
        ops::linear(pool, xn, n, D, D, A.idx_compressor.wgate.f32(), w.index,
                    packed + off + w.index, ld);
    }
}

void attn_queries(const LayerWeights& L, const ModelConfig& cfg, const RopeTables& ropes,
                  const Rows& rows, const float* xn, AttnScratch& s, ThreadPool& pool) {
    const int64_t n = rows.n(), D = cfg.d_model;
    const int H = cfg.n_heads, d = cfg.head_dim;
    const int64_t Hd = int64_t{H} * d;
    const float eps = static_cast<float>(cfg.norm_eps);
    const AttentionWeights& A = L.attn;
    const ops::RopeTable& rope = ropes.for_layer(L.type);
    // c_q = q_norm(x·wq_a); q = rope(rmsnorm_per_head(c_q·wq_b)).
    s.cq.resize(n * cfg.q_rank);
    s.q.resize(n * Hd);
    ops::linear_act(pool, L.activations, xn, n, D, A.wq_a.f32(), cfg.q_rank, s.cq.data());
    ops::rmsnorm(s.cq.data(), n, cfg.q_rank, A.q_norm.f32(), eps, s.cq.data());
    ops::linear_act(pool, L.activations, s.cq.data(), n, cfg.q_rank, A.wq_b.f32(), Hd, s.q.data());
    ops::rmsnorm(s.q.data(), n * H, d, nullptr, eps, s.q.data());
    ops::apply_rope(rope, s.q.data(), n, Hd, H, d, rows.pos.data(), false);
    if (L.type != AttnType::CSA) return;
    // Indexer: q_I = rope(c_q · wq_b_I) (no norm); head weights w_I = (x · weights_proj) /
    // sqrt(n_I).
    const int nI = cfg.index_n_heads, dI = cfg.index_head_dim;
    s.qI.resize(n * nI * dI);
    s.wI.resize(n * nI);
    ops::linear_act(pool, L.activations, s.cq.data(), n, cfg.q_rank, A.idx_wq_b.f32(),
                    int64_t{nI} * dI, s.qI.data());
    ops::apply_rope(rope, s.qI.data(), n, int64_t{nI} * dI, nI, dI, rows.pos.data(), false);
    // The study's rounding (LayerWeights::indexer_rounding), after RoPE as the keys' in kv_append.
    ops::round_indexer_rows(L.indexer_rounding, s.qI.data(), n, int64_t{nI} * dI);
    ops::linear(pool, xn, n, D, A.idx_weights_proj.f32(), nI, s.wI.data());
    const float ws = 1.0f / std::sqrt(static_cast<float>(nI));
    for (float& v : s.wI) v *= ws;
}

void attn_output(const LayerWeights& L, int layer, const ModelConfig& cfg, const RopeTables& ropes,
                 const Rows& rows, const KvStore& store, AttnScratch& s, float* out, int32_t* topk,
                 ThreadPool& pool) {
    const int64_t n = rows.n(), D = cfg.d_model;
    const int H = cfg.n_heads, d = cfg.head_dim;
    const int64_t Hd = int64_t{H} * d;
    const bool csa = L.type == AttnType::CSA;
    const int ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
    const int nI = cfg.index_n_heads, dI = cfg.index_head_dim, K = cfg.index_topk;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float idx_scale = 1.0f / std::sqrt(static_cast<float>(dI));
    s.o.assign(n * Hd, 0.0f);
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
        std::vector<float> scratch, idx_scratch;
        std::vector<int32_t> sel(csa ? K : 0);
        for (int64_t t = begin; t < end; ++t) {
            if (topk) std::fill(topk + t * K, topk + (t + 1) * K, -1);
            if (!rows.valid[t]) continue;
            const LayerKv& st = store[rows.request[t]][layer];
            const int64_t p = rows.pos[t];
            CPFILL_CHECK(p < st.n_tokens, "query at position {} but the KV store holds {} tokens",
                         p, st.n_tokens);
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
                    keys.n_entries =
                        ops::indexer_select(s.qI.data() + t * nI * dI, s.wI.data() + t * nI, nI, dI,
                                            st.index_keys.data(), eligible, K, idx_scale,
                                            sel.data(), idx_scratch.data());
                    keys.entry_idx = sel.data();
                    if (topk) std::copy(sel.begin(), sel.end(), topk + t * K);
                }
            }
            scratch.resize(H * (keys.n_window + keys.n_entries) + d * keys.n_entries);
            ops::attend_one(s.q.data() + t * Hd, H, d, keys, L.attn.sink.f32(), scale,
                            s.o.data() + t * Hd, scratch.data());
        }
    });
    // De-rotate the rope slice at the query position, then the grouped output projection.
    ops::apply_rope(ropes.for_layer(L.type), s.o.data(), n, Hd, H, d, rows.pos.data(), true);
    const int g = cfg.o_groups;
    const int64_t group_in = Hd / g, ro = cfg.o_rank;
    s.y.resize(n * g * ro);
    for (int gi = 0; gi < g; ++gi)
        ops::linear_act(pool, L.activations, s.o.data() + gi * group_in, n, group_in, Hd,
                        L.attn.wo_a.f32() + gi * ro * group_in, ro, s.y.data() + gi * ro, g * ro);
    ops::linear_act(pool, L.activations, s.y.data(), n, g * ro, L.attn.wo_b.f32(), D, out);
}

}  // namespace cpfill
