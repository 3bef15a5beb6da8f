// mHC on the GPU (docs/architecture.md §3.3, §3.9): the same three steps as ops/mhc.h, fp32 math
// throughout (docs/design.md §3).
//
// The residual state h: [rows, hc, d_model], stream-major per token, fp32 or bf16 — each op that
// reads or writes it has an overload for each. fp32 (the default, GpuRunOptions::residual) keeps
// it at the CPU reference's precision for 4·d_model·4 bytes per token; bf16, as the release's
// reference inference keeps it, halves those bytes and rounds h (to nearest even) at every update
// (docs/numerics.md, "The residual in bf16": 0.3% of the logits on the fidelity fixture). All
// arithmetic is fp32 either way. Sub-block inputs (x, z) and outputs (o) are bf16, like every
// other activation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemm.h"

namespace cpfill::ops::cuda {

// Device pointers; the fields mean what they mean in ops::MhcParams. hc ∈ [1, 4].
struct MhcDeviceParams {
    const float* fn;     // fp32 [(2 + hc) · hc, hc · d_model]
    const float* base;   // fp32 [(2 + hc) · hc]
    const float* scale;  // fp32 [3]
    int hc;
    int64_t d_model;
    int sinkhorn_iters;
    float hc_eps;
    float norm_eps;
};

// Per row of h (fp32 [rows, hc, d_model]): post fp32 [rows, hc], comb fp32 [rows, hc, hc] (Sinkhorn
// projected, comb[j, k] mixes stream j into stream k) and the collapse x bf16 [rows, d_model] =
// Σ_j pre_j · h[j]. The (2 + hc)·hc mixing dot products are one fp32 cuBLASLt GEMM over all rows
// (mixes fp32 [rows, (2 + hc)·hc] scratch); then one kernel adds the sums of squares, the
// per-token sigmoid / softmax / Sinkhorn and the collapse. (A variant that did the dot products
// in that kernel re-read fn from L2 for every 4 tokens, ≈ 6 × the bytes of h; it was removed in
// stop 18, kept alive only by its test. mhc_head still does its hc products so.)
void mhc_pre(const MhcDeviceParams& p, const float* h, int64_t rows, float* post, float* comb,
             __nv_bfloat16* x, GemmContext& gemm, float* mixes, cudaStream_t stream);
// bf16 h: the same, the dot products in the kernel itself (cuBLASLt multiplies no bf16 by fp32):
// fn is read from L2 once per 4 tokens. The engine calls it once per chunk (the first site; the
// others are mhc_post_pre), or at every site with GpuRunOptions::mhc_fused off.
void mhc_pre(const MhcDeviceParams& p, const __nv_bfloat16* h, int64_t rows, float* post,
             float* comb, __nv_bfloat16* x, cudaStream_t stream);

// h[t, k] ← post_k · o[t] + Σ_j comb[j, k] · h[t, j], in place. post fp32 [rows, hc], comb fp32
// [rows, hc, hc], o bf16 [rows, d_model], h fp32 [rows, hc, d_model].
void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, float* h, cudaStream_t stream);
void mhc_post(const float* post, const float* comb, const __nv_bfloat16* o, int hc, int64_t d_model,
              int64_t rows, __nv_bfloat16* h, cudaStream_t stream);

// Bytes of the fp32 scratch that mhc_post_pre needs for any call of at most `rows` tokens: per
// token and per slice of d_model, the (2 + hc)·hc mixing dot products and the sum of squares. The
// slices are how many blocks share one tile of tokens (1 when the tiles fill the GPU, up to 8 when
// rows are few): max(rows, min(8 · rows, 8448)) · ((2 + hc)·hc + 1) · 4 bytes.
int64_t mhc_post_pre_scratch_bytes(int hc, int64_t d_model, int64_t rows);

// One site boundary in two kernels, on h read twice and written once instead of five reads and
// one write: mhc_post (post_in, comb_in, o → h, in place, as mhc_post), then mhc_pre of the next
// site `next` on the updated h (post_out, comb_out and the collapse x), then — when norm_w !=
// nullptr — y = rmsnorm(x) · norm_w as ops::cuda::rmsnorm computes it (x rounded to bf16 first,
// the statistics over those bf16 values, eps = norm_eps). norm_w == nullptr: y is the bf16
// collapse itself. post_in fp32 [rows, hc], comb_in fp32 [rows, hc, hc], o bf16 [rows, d_model],
// h fp32 [rows, hc, d_model], post_out fp32 [rows, hc], comb_out fp32 [rows, hc, hc], norm_w fp32
// [d_model] or null, y bf16 [rows, d_model], scratch: mhc_post_pre_scratch_bytes. post_out /
// comb_out may alias post_in / comb_in, and y may alias o. The mixing products are fp32 on CUDA
// cores (no TF32), summed in another order than mhc_pre's GEMM: post / comb agree to ~1e-6.
// bf16 h: each updated value is rounded to bf16 as it is stored, and the next site's products,
// its sum of squares and the collapse are taken from the rounded values (what mhc_pre would read).
void mhc_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                  const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                  float* h, float* post_out, float* comb_out, __nv_bfloat16* y, float* scratch,
                  cudaStream_t stream);
void mhc_post_pre(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                  const MhcDeviceParams& next, const float* norm_w, float norm_eps, int64_t rows,
                  __nv_bfloat16* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                  float* scratch, cudaStream_t stream);

// The first site of a chunk, where every stream of h holds the same values (embed_streams wrote
// the embedding into each): mhc_post_pre's second half alone — the site's post / comb and y =
// rmsnorm(collapse) · norm_w (or the collapse: norm_w == nullptr) — with the same kernels, reading
// stream 0 of each row alone (a quarter of h's bytes) and writing nothing to h. What mhc_pre and
// rmsnorm give on that h, with the mixing products summed in mhc_post_pre's order (row by row the
// same whatever the row count: a TBO half equals one pass). scratch: mhc_post_pre_scratch_bytes.
void mhc_pre_first(const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                   const float* h, float* post, float* comb, __nv_bfloat16* y, float* scratch,
                   cudaStream_t stream);
void mhc_pre_first(const MhcDeviceParams& p, const float* norm_w, float norm_eps, int64_t rows,
                   const __nv_bfloat16* h, float* post, float* comb, __nv_bfloat16* y,
                   float* scratch, cudaStream_t stream);

// The first boundary of a chunk (the first site's post, the next site's pre and RMSNorm) where h's
// streams all hold stream 0's values but only stream 0 was written (embed_streams with written =
// 1; the first site ran mhc_pre_first): mhc_post_pre reading stream 0 alone (a quarter of h's
// bytes in) and writing every stream. The same arithmetic as mhc_post_pre on h with every stream
// written, so the same bits; streams 1 … hc − 1 may hold anything on entry.
void mhc_post_pre_first(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                        const MhcDeviceParams& next, const float* norm_w, float norm_eps,
                        int64_t rows, float* h, float* post_out, float* comb_out, __nv_bfloat16* y,
                        float* scratch, cudaStream_t stream);
void mhc_post_pre_first(const float* post_in, const float* comb_in, const __nv_bfloat16* o,
                        const MhcDeviceParams& next, const float* norm_w, float norm_eps,
                        int64_t rows, __nv_bfloat16* h, float* post_out, float* comb_out,
                        __nv_bfloat16* y, float* scratch, cudaStream_t stream);

// Final head collapse: z[t] = Σ_j (sigmoid(scale · (fn · rmsnorm(h[t]))_j + base_j) + hc_eps) h[t,
// j]. fn fp32 [hc, hc · d_model], base fp32 [hc], scale fp32 [1] (device); z bf16 [rows, d_model].
void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const float* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream);
void mhc_head(const float* fn, const float* base, const float* scale, int hc, int64_t d_model,
              float hc_eps, float norm_eps, const __nv_bfloat16* h, int64_t rows, __nv_bfloat16* z,
              cudaStream_t stream);

}  // namespace cpfill::ops::cuda
