// mHC: mixing logits through one GEMM over the RMS-normalised flattened streams, then per-token
// sigmoid / Sinkhorn math (HF DeepseekV4HyperConnection order of operations).
#include "ops/mhc.h"

#include <cmath>
#include <vector>

#include "ops/linear.h"
#include "ops/norm.h"

namespace cpfill::ops {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void mhc_pre_rows(const MhcParams& p, const float* h, int64_t rows, float* post, float* comb,
                  float* x, float* mix, float* normed) {
    const int hc = p.hc;
    const int n_mix = (2 + hc) * hc;
    const int64_t width = hc * p.d_model;
    rmsnorm(h, rows, width, nullptr, p.norm_eps, normed);
    linear(normed, rows, width, p.fn, n_mix, mix);
    std::vector<float> c(hc * hc);
    for (int64_t t = 0; t < rows; ++t) {
        const float* m = mix + t * n_mix;
        std::vector<float> pre(hc);
        for (int j = 0; j < hc; ++j) {
            pre[j] = sigmoid(m[j] * p.scale[0] + p.base[j]) + p.hc_eps;
            post[t * hc + j] = 2.0f * sigmoid(m[hc + j] * p.scale[1] + p.base[hc + j]);
        }
        // comb logits [j, k], softmax over k, + eps, then column / row normalisations.
        for (int j = 0; j < hc; ++j) {
            float mx = -INFINITY;
            for (int k = 0; k < hc; ++k) {
                c[j * hc + k] = m[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
                mx = std::max(mx, c[j * hc + k]);
            }
            float sum = 0;
            for (int k = 0; k < hc; ++k) sum += (c[j * hc + k] = std::exp(c[j * hc + k] - mx));
            for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + p.hc_eps;
        }
        auto norm_cols = [&] {
            for (int k = 0; k < hc; ++k) {
                float s = 0;
                for (int j = 0; j < hc; ++j) s += c[j * hc + k];
                for (int j = 0; j < hc; ++j) c[j * hc + k] /= (s + p.hc_eps);
            }
        };
        auto norm_rows = [&] {
            for (int j = 0; j < hc; ++j) {
                float s = 0;
                for (int k = 0; k < hc; ++k) s += c[j * hc + k];
                for (int k = 0; k < hc; ++k) c[j * hc + k] /= (s + p.hc_eps);
            }
        };
        norm_cols();
        for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
            norm_rows();
            norm_cols();
        }
        for (int i = 0; i < hc * hc; ++i) comb[t * hc * hc + i] = c[i];
        float* xt = x + t * p.d_model;
        const float* ht = h + t * width;
        for (int64_t d = 0; d < p.d_model; ++d) {
            float acc = 0;
            for (int j = 0; j < hc; ++j) acc += pre[j] * ht[j * p.d_model + d];
            xt[d] = acc;
        }
    }
}

void mhc_post_rows(const float* post, const float* comb, const float* o, int hc, int64_t d_model,
                   int64_t rows, float* h) {
    std::vector<float> old(hc * d_model);
    for (int64_t t = 0; t < rows; ++t) {
        float* ht = h + t * hc * d_model;
        std::copy(ht, ht + hc * d_model, old.begin());
        const float* ct = comb + t * hc * hc;
        const float* ot = o + t * d_model;
        for (int k = 0; k < hc; ++k) {
            float pk = post[t * hc + k];
            for (int64_t d = 0; d < d_model; ++d) {
                float acc = 0;
                for (int j = 0; j < hc; ++j) acc += ct[j * hc + k] * old[j * d_model + d];
                ht[k * d_model + d] = pk * ot[d] + acc;
            }
        }
    }
}

void mhc_head_rows(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
                   float hc_eps, float norm_eps, const float* h, int64_t rows, float* z,
                   float* normed) {
    const int64_t width = hc * d_model;
    rmsnorm(h, rows, width, nullptr, norm_eps, normed);
    std::vector<float> mix(rows * hc);
    linear(normed, rows, width, fn, hc, mix.data());
    for (int64_t t = 0; t < rows; ++t) {
        const float* ht = h + t * width;
        float* zt = z + t * d_model;
        std::vector<float> pre(hc);
        for (int j = 0; j < hc; ++j)
            pre[j] = sigmoid(mix[t * hc + j] * scale[0] + base[j]) + hc_eps;
        for (int64_t d = 0; d < d_model; ++d) {
            float acc = 0;
            for (int j = 0; j < hc; ++j) acc += pre[j] * ht[j * d_model + d];
            zt[d] = acc;
        }
    }
}

}  // namespace

// Each wrapper runs the per-token math on disjoint row chunks (single-threaded BLAS inside).
void mhc_pre(const MhcParams& p, const float* h, int64_t rows, float* post, float* comb, float* x,
             float* mix, float* normed, ThreadPool& pool) {
    const int64_t n_mix = (2 + p.hc) * p.hc, width = p.hc * p.d_model;
    pool.parallel_for(rows, [&](int64_t b, int64_t e) {
        mhc_pre_rows(p, h + b * width, e - b, post + b * p.hc, comb + b * p.hc * p.hc,
                     x + b * p.d_model, mix + b * n_mix, normed + b * width);
    });
}

void mhc_post(const float* post, const float* comb, const float* o, int hc, int64_t d_model,
              int64_t rows, float* h, ThreadPool& pool) {
    pool.parallel_for(rows, [&](int64_t b, int64_t e) {
        mhc_post_rows(post + b * hc, comb + b * hc * hc, o + b * d_model, hc, d_model, e - b,
                      h + b * hc * d_model);
    });
}

void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, float* z, float* normed,
              ThreadPool& pool) {
    pool.parallel_for(rows, [&](int64_t b, int64_t e) {
        mhc_head_rows(fn, base, scale, hc, d_model, hc_eps, norm_eps, h + b * hc * d_model, e - b,
                      z + b * d_model, normed + b * hc * d_model);
    });
}

}  // namespace cpfill::ops
