// Manifold-constrained hyper-connections (docs/architecture.md §3.3, §3.9), per token, fp32.
// Residual state h: [rows, hc, d_model] (stream-major per token).
#pragma once

#include <cstdint>

#include "core/parallel.h"

namespace cpfill::ops {

struct MhcParams {
    const float* fn;     // [(2 + hc) · hc, hc · d_model]
    const float* base;   // [(2 + hc) · hc]
    const float* scale;  // [3]
    int hc;
    int64_t d_model;
    int sinkhorn_iters;
    float hc_eps;
    float norm_eps;
};

// Computes, per row: post [rows, hc], comb [rows, hc, hc] (Sinkhorn-projected) and the collapsed
// stream x [rows, d_model] = Σ_j pre_j · h[j]. `mix` is scratch of rows · (2 + hc) · hc floats and
// `normed` scratch of rows · hc · d_model floats.
void mhc_pre(const MhcParams& p, const float* h, int64_t rows, float* post, float* comb, float* x,
             float* mix, float* normed, ThreadPool& pool);

// h[t, k] ← post_k · o[t] + Σ_j comb[j, k] · h[t, j], in place (o: [rows, d_model]).
void mhc_post(const float* post, const float* comb, const float* o, int hc, int64_t d_model,
              int64_t rows, float* h, ThreadPool& pool);

// Final head collapse: z[t] = Σ_j (sigmoid(scale · (fn · rmsnorm(h[t]))_j + base_j) + eps) h[t, j].
// fn [hc, hc · d_model], base [hc], scale [1]. `normed` scratch of rows · hc · d_model floats.
void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, float* z, float* normed,
              ThreadPool& pool);

}  // namespace cpfill::ops
