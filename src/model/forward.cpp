// forward: the layer loop over the flattened batch, keeping the [n_tokens, hc, d_model] residual.
#include "model/forward.h"

#include <cstring>

#include "model/attention.h"
#include "model/moe.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"

namespace cpfill {

namespace {

ops::MhcParams mhc_params(const MhcWeights& m, const ModelConfig& cfg) {
    return {m.fn.f32(),
            m.base.f32(),
            m.scale.f32(),
            cfg.hc,
            cfg.d_model,
            cfg.hc_sinkhorn_iters,
            static_cast<float>(cfg.hc_eps),
            static_cast<float>(cfg.norm_eps)};
}

// Scratch shared by both sub-blocks of every layer.
struct Scratch {
    std::vector<float> post, comb, x, mix, normed, sub_out;
    Scratch(int64_t n, const ModelConfig& c)
        : post(n * c.hc),
          comb(n * c.hc * c.hc),
          x(n * c.d_model),
          mix(n * (2 + c.hc) * c.hc),
          normed(n * c.hc * c.d_model),
          sub_out(n * c.d_model) {}
};

Tensor snapshot(const std::vector<float>& v, Shape shape) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    std::memcpy(t.f32(), v.data(), t.nbytes());
    return t;
}

}  // namespace

ForwardOutput forward(const ModelWeights& w, const Batch& b, const ForwardOptions& opt,
                      ThreadPool& pool) {
    const ModelConfig& cfg = w.cfg;
    const int64_t n = b.n_tokens(), D = cfg.d_model, hc = cfg.hc;
    const float eps = static_cast<float>(cfg.norm_eps);
    ForwardOutput result;

    // Embedding, copied into every stream.
    std::vector<float> h(n * hc * D);
    for (int64_t t = 0; t < n; ++t)
        for (int j = 0; j < hc; ++j)
            std::memcpy(h.data() + (t * hc + j) * D, w.embed.f32() + int64_t{b.tokens[t]} * D,
                        D * sizeof(float));
    if (opt.record_hidden) result.hidden.push_back(snapshot(h, {n, hc, D}));

    const RopeTables ropes(cfg);
    Scratch s(n, cfg);
    std::vector<LayerKv> kv(b.n_requests());
    for (int li = 0; li < cfg.n_layers; ++li) {
        const LayerWeights& L = w.layers[li];
        // Attention site.
        ops::mhc_pre(mhc_params(L.hc_attn, cfg), h.data(), n, s.post.data(), s.comb.data(),
                     s.x.data(), s.mix.data(), s.normed.data(), pool);
        ops::rmsnorm(s.x.data(), n, D, L.attn_norm.f32(), eps, s.x.data());
        Tensor topk;
        if (opt.record_topk && L.type == AttnType::CSA)
            topk = Tensor::empty(DType::I32, {n, cfg.index_topk});
        attention_forward(L, cfg, ropes, b, s.x.data(), kv, s.sub_out.data(),
                          topk.defined() ? topk.data<int32_t>() : nullptr, pool);
        ops::mhc_post(s.post.data(), s.comb.data(), s.sub_out.data(), hc, D, n, h.data(), pool);
        if (opt.record_topk) result.topk.push_back(std::move(topk));
        // MoE site.
        ops::mhc_pre(mhc_params(L.hc_ffn, cfg), h.data(), n, s.post.data(), s.comb.data(),
                     s.x.data(), s.mix.data(), s.normed.data(), pool);
        ops::rmsnorm(s.x.data(), n, D, L.ffn_norm.f32(), eps, s.x.data());
        moe_forward(L.moe, L.mlp, cfg, s.x.data(), b.tokens.data(), n, s.sub_out.data(), pool);
        ops::mhc_post(s.post.data(), s.comb.data(), s.sub_out.data(), hc, D, n, h.data(), pool);
        if (opt.record_hidden) result.hidden.push_back(snapshot(h, {n, hc, D}));
    }

    // Head, only for the rows whose logits are wanted (all rows when hidden states are kept).
    std::vector<int64_t> rows;
    if (opt.all_logits || opt.record_hidden) {
        for (int64_t t = 0; t < n; ++t) rows.push_back(t);
    } else {
        for (int r = 0; r < b.n_requests(); ++r) rows.push_back(b.request_start[r + 1] - 1);
    }
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<float> hr(m * hc * D), z(m * D);
    for (int64_t i = 0; i < m; ++i)
        std::memcpy(hr.data() + i * hc * D, h.data() + rows[i] * hc * D, hc * D * sizeof(float));
    ops::mhc_head(w.hc_head_fn.f32(), w.hc_head_base.f32(), w.hc_head_scale.f32(), hc, D,
                  static_cast<float>(cfg.hc_eps), eps, hr.data(), m, z.data(), s.normed.data(),
                  pool);
    ops::rmsnorm(z.data(), m, D, w.norm.f32(), eps, z.data());
    if (opt.record_hidden) result.hidden.push_back(snapshot(z, {n, D}));
    const int64_t V = cfg.vocab_size;
    std::vector<float> logits(m * V);
    ops::linear(pool, z.data(), m, D, w.head.f32(), V, logits.data());

    for (int r = 0; r < b.n_requests(); ++r) {
        const int64_t len = b.request_len(r);
        const bool all = opt.all_logits;
        Tensor t = Tensor::empty(DType::F32, all ? Shape{len, V} : Shape{V});
        const int64_t first =
            (m == n) ? (all ? b.request_start[r] : b.request_start[r + 1] - 1) : r;
        std::memcpy(t.f32(), logits.data() + first * V, t.nbytes());
        result.logits.push_back(std::move(t));
    }
    return result;
}

}  // namespace cpfill
