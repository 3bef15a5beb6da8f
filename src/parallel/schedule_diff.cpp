// row_choices: one row's layer replayed from the records (mHC, attention against the final KV
// store, router); find_parting: the first position whose logits part and the choice behind it.
#include "parallel/schedule_diff.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/attention.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"

namespace cpfill {

namespace {

ops::MhcParams mhc_params(const MhcWeights& m, const ModelConfig& cfg) {
    return {m.fn.f32(),  m.base.f32(),          m.scale.f32(),     cfg.hc,
            cfg.d_model, cfg.hc_sinkhorn_iters, float(cfg.hc_eps), float(cfg.norm_eps)};
}

// Top-k of `key` as the CPU kernels take it (larger first, ties towards the lower index).
TopkChoice top_choice(const std::vector<float>& key, int64_t k) {
    TopkChoice c;
    const int64_t n = static_cast<int64_t>(key.size());
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
    k = std::min(k, n);
    c.chosen.assign(order.begin(), order.begin() + k);
    std::sort(c.chosen.begin(), c.chosen.end());
    if (k < n) {
        double scale = 0;
        for (float v : key) scale = std::max(scale, std::abs(double(v)));
        const double gap = double(key[order[k - 1]]) - double(key[order[k]]);
        c.margin = scale > 0 ? gap / scale : gap;
    }
    return c;
}

// The indexer's scores of query `pos` over its eligible entries (ops/cpu/indexer.cpp's sums).
TopkChoice indexer_choice(const ModelConfig& cfg, const AttnScratch& s, const LayerKv& kv,
                          int64_t pos) {
    const int nI = cfg.index_n_heads, dI = cfg.index_head_dim;
    const int64_t eligible = std::min<int64_t>((pos + 1) / cfg.csa_ratio, kv.n_entries);
    std::vector<float> dots(nI * eligible), score(eligible, 0.0f);
    ops::linear(s.qI.data(), nI, dI, kv.index_keys.data(), eligible, dots.data());
    const float scale = 1.0f / std::sqrt(static_cast<float>(dI));
    for (int h = 0; h < nI; ++h)
        for (int64_t e = 0; e < eligible; ++e)
            score[e] += std::max(dots[h * eligible + e], 0.0f) * scale * s.wI[h];
    return top_choice(score, cfg.index_topk);
}

// Positions of the requests before `request` in the runs' row order.
int64_t row_of(const PrefillOutput& run, int request, int64_t pos) {
    int64_t row = pos;
    for (int q = 0; q < request; ++q) row += run.kv[q][0].n_tokens;
    return row;
}

}  // namespace

RowChoices row_choices(const ModelWeights& w, const PrefillOutput& run, int request, int64_t pos,
                       int layer) {
    const ModelConfig& cfg = w.cfg;
    CPFILL_CHECK(run.hidden.size() == size_t(cfg.n_layers) + 2 && !run.kv.empty(),
                 "row_choices needs a run with record_hidden and its KV store");
    const LayerWeights& L = w.layers[layer];
    const int64_t D = cfg.d_model, hc = cfg.hc;
    const float eps = static_cast<float>(cfg.norm_eps);
    const float* h0 = run.hidden[layer].f32() + row_of(run, request, pos) * hc * D;
    std::vector<float> h(h0, h0 + hc * D), post(hc), comb(hc * hc), x(D), mix((2 + hc) * hc),
        normed(hc * D), out(D);
    ThreadPool pool(1);
    const RopeTables ropes(cfg);
    ops::mhc_pre(mhc_params(L.hc_attn, cfg), h.data(), 1, post.data(), comb.data(), x.data(),
                 mix.data(), normed.data(), pool);
    ops::rmsnorm(x.data(), 1, D, L.attn_norm.f32(), eps, x.data());
    Rows rows;
    rows.tokens = {0};  // attention does not read the token
    rows.request = {request};
    rows.pos = {pos};
    rows.valid = {1};
    AttnScratch s;
    attn_queries(L, cfg, ropes, rows, x.data(), s, pool);
    RowChoices c;
    if (L.type == AttnType::CSA) c.indexer = indexer_choice(cfg, s, run.kv[request][layer], pos);
    if (L.mlp != MlpType::Learned) return c;  // hash routing chooses nothing
    attn_output(L, layer, cfg, ropes, rows, run.kv, s, out.data(), nullptr, pool);
    ops::mhc_post(post.data(), comb.data(), out.data(), cfg.hc, D, 1, h.data(), pool);
    ops::mhc_pre(mhc_params(L.hc_ffn, cfg), h.data(), 1, post.data(), comb.data(), x.data(),
                 mix.data(), normed.data(), pool);
    ops::rmsnorm(x.data(), 1, D, L.ffn_norm.f32(), eps, x.data());
    std::vector<float> key(cfg.n_experts);
    ops::linear(x.data(), 1, D, L.moe.gate.f32(), cfg.n_experts, key.data());
    for (int e = 0; e < cfg.n_experts; ++e) {  // ops/cpu/moe.cpp: sqrt(softplus) + bias
        const float sp = key[e] > 20.0f ? key[e] : std::log1p(std::exp(key[e]));
        key[e] = std::sqrt(sp) + (L.moe.gate_bias.defined() ? L.moe.gate_bias.f32()[e] : 0.0f);
    }
    c.router = top_choice(key, cfg.top_k);
    return c;
}

Parting find_parting(const ModelWeights& w, const PrefillOutput& a, const PrefillOutput& b,
                     double tol) {
    const ModelConfig& cfg = w.cfg;
    const int64_t V = cfg.vocab_size, K = cfg.index_topk;
    CPFILL_CHECK(a.logits.size() == b.logits.size(), "runs of {} and {} requests", a.logits.size(),
                 b.logits.size());
    Parting p;
    for (size_t r = 0; r < a.logits.size(); ++r) {
        const Tensor &la = a.logits[r], &lb = b.logits[r];
        CPFILL_CHECK(la.ndim() == 2 && la.numel() == lb.numel(), "find_parting needs all_logits");
        double scale = 0;
        for (int64_t i = 0; i < la.numel(); ++i)
            scale = std::max(scale, std::abs(double(la.f32()[i])));
        scale = scale > 0 ? scale : 1;
        for (int64_t t = 0; t < la.dim(0); ++t) {
            double d = 0;
            for (int64_t v = 0; v < V; ++v)
                d = std::max(d, std::abs(double(lb.f32()[t * V + v]) - la.f32()[t * V + v]));
            d /= scale;
            p.diff = std::max(p.diff, d);
            if (p.request >= 0) continue;
            if (d > tol) {
                p.request = static_cast<int>(r);
                p.pos = t;
            } else {
                p.before = std::max(p.before, d);
            }
        }
        if (p.request < 0) p.before = 0;  // only the parting request's earlier positions count
    }
    if (p.request < 0) return p;
    const int64_t row = row_of(a, p.request, p.pos);
    auto recorded = [&](const PrefillOutput& o, int li) {  // the indexer's selection, as a set
        CPFILL_CHECK(o.topk.size() == size_t(cfg.n_layers), "find_parting needs record_topk");
        const int32_t* s = o.topk[li].data<int32_t>() + row * K;
        std::vector<int32_t> v(s, s + K);
        std::sort(v.begin(), v.end());
        return v;
    };
    // The first choice that differs; when none is seen to (a recomputed near-tie can fall the same
    // way twice), the one of smallest margin.
    auto consider = [&](int li, const char* what, bool differs, double ma, double mb) {
        const bool first_differing = differs && !p.differs;
        const bool closer =
            !p.differs && !differs && std::min(ma, mb) < std::min(p.margin, p.margin_b);
        if (!first_differing && !closer) return;
        p.layer = li;
        p.choice = what;
        p.differs = differs;
        p.margin = ma;
        p.margin_b = mb;
    };
    for (int li = 0; li < cfg.n_layers; ++li) {
        const LayerWeights& L = w.layers[li];
        if (L.type != AttnType::CSA && L.mlp != MlpType::Learned) continue;
        const RowChoices ca = row_choices(w, a, p.request, p.pos, li);
        const RowChoices cb = row_choices(w, b, p.request, p.pos, li);
        if (L.type == AttnType::CSA)
            consider(li, "indexer", recorded(a, li) != recorded(b, li), ca.indexer.margin,
                     cb.indexer.margin);
        if (L.mlp == MlpType::Learned)
            consider(li, "router", ca.router.chosen != cb.router.chosen, ca.router.margin,
                     cb.router.margin);
    }
    return p;
}

}  // namespace cpfill
