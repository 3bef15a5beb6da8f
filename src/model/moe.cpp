// moe_forward: route, then per expert gather → [w1;w3] → SwiGLU → w2 → weighted scatter-add.
#include "model/moe.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/act_rounding.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace cpfill {

namespace {

// out[rows] = swiglu(x[rows] · [w1;w3]ᵀ) · w2ᵀ for one expert (both inputs rounded as `act` says:
// ops/act_rounding.h).
void run_expert(const Tensor& w13, const Tensor& w2, const ModelConfig& cfg, ActRounding act,
                const float* x, int64_t n, float* out, ThreadPool& pool) {
    const int64_t width = w2.dim(1), D = cfg.d_model;
    std::vector<float> gu(n * 2 * width), a(n * width);
    ops::linear_act(pool, act, x, n, D, w13.f32(), 2 * width, gu.data());
    ops::swiglu(gu.data(), n, width, static_cast<float>(cfg.swiglu_limit), a.data());
    ops::linear_act(pool, act, a.data(), n, width, w2.f32(), D, out);
}

}  // namespace

void moe_forward(const LayerWeights& L, const ModelConfig& cfg, const float* y,
                 const int32_t* tokens, int64_t n, float* out, ThreadPool& pool, int32_t* routes) {
    const MoeWeights& W = L.moe;
    const MlpType type = L.mlp;
    const ActRounding act = L.activations;
    const int E = cfg.n_experts, K = cfg.top_k;
    const int64_t D = cfg.d_model;
    std::vector<float> logits(n * E), weight(n * K);
    std::vector<int32_t> idx(n * K);
    ops::linear(pool, y, n, D, W.gate.f32(), E, logits.data());
    std::vector<int64_t> hash;
    if (type == MlpType::Hash) {
        hash.resize(n * K);
        const int64_t* table = W.tid2eid.data<int64_t>();
        for (int64_t t = 0; t < n; ++t)
            for (int i = 0; i < K; ++i) {
                int64_t e = table[static_cast<int64_t>(tokens[t]) * K + i];
                CPFILL_CHECK(e >= 0 && e < E, "tid2eid[{}] names expert {}: expected 0 <= e < {}",
                             tokens[t], e, E);
                hash[t * K + i] = e;
            }
    }
    ops::route(logits.data(), n, E, K, W.gate_bias.defined() ? W.gate_bias.f32() : nullptr,
               hash.empty() ? nullptr : hash.data(), static_cast<float>(cfg.routed_scale),
               idx.data(), weight.data());
    if (routes) std::copy(idx.begin(), idx.end(), routes);

    // Routed experts in expert order (as HF accumulates), then the shared expert.
    std::memset(out, 0, n * D * sizeof(float));
    std::vector<std::vector<std::pair<int64_t, float>>> users(E);
    for (int64_t t = 0; t < n; ++t)
        for (int i = 0; i < K; ++i) users[idx[t * K + i]].push_back({t, weight[t * K + i]});
    std::vector<float> xg, og;
    for (int e = 0; e < E; ++e) {
        const auto& u = users[e];
        if (u.empty()) continue;
        const int64_t m = static_cast<int64_t>(u.size());
        xg.resize(m * D);
        og.resize(m * D);
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(xg.data() + j * D, y + u[j].first * D, D * sizeof(float));
        run_expert(W.w13[e], W.w2[e], cfg, act, xg.data(), m, og.data(), pool);
        for (int64_t j = 0; j < m; ++j) {
            float* dst = out + u[j].first * D;
            const float* src = og.data() + j * D;
            for (int64_t c = 0; c < D; ++c) dst[c] += src[c] * u[j].second;
        }
    }
    std::vector<float> shared(n * D);
    run_expert(W.shared_w13, W.shared_w2, cfg, act, y, n, shared.data(), pool);
    for (int64_t i = 0; i < n * D; ++i) out[i] += shared[i];
}

}  // namespace cpfill
