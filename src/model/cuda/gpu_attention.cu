// GPU attention stages: projections through cuBLASLt, norms, RoPE, pooling, indexer, attention.
#include <algorithm>
#include <cmath>

#include "model/cuda/gpu_attention.h"
#include "model/kv_store.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/rows.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace oc = ops::cuda;

namespace {

const DeviceBuffer& inv_freq(const GpuWeights& W, const GpuLayer& L) {
    return L.type == AttnType::Sliding ? W.inv_freq_main : W.inv_freq_compress;
}

// RMSNorm of `heads` blocks of `dim` channels, then RoPE on their last rope_dim channels.
oc::NormRope norm_rope(const ModelConfig& cfg, int heads, int64_t dim, const float* w,
                       const DeviceBuffer& freq, const int64_t* pos) {
    oc::NormRope p;
    p.heads = heads;
    p.head_dim = static_cast<int>(dim);
    p.w = w;
    p.eps = float(cfg.norm_eps);
    p.rope_dim = cfg.rope_dim;
    p.inv_freq = freq.as<float>();
    p.pos = pos;
    return p;
}

// A bf16-only projection (the compressors' and the router's: bf16 in the release).
void linear(const GpuCtx& c, const bf16* x, int64_t n, int64_t in, const DeviceBuffer& w,
            int64_t out, bf16* y, int64_t ldy) {
    oc::gemm_bf16(*c.gemm, x, in, n, in, w.as<bf16>(), out, y, nullptr, ldy, false, c.stream);
}

void linear(const GpuCtx& c, const bf16* x, int64_t n, const GpuMatrix& w, bf16* y, int64_t ldy) {
    gpu_linear(c, w, x, w.cols, n, y, nullptr, ldy);
}

// Pools windows [first, last) of one compressor from packed request rows (rows[0] is position
// row0) into dst rows.
void pool(const GpuCtx& c, const GpuWeights& W, const GpuCompressor& comp, int ratio, int64_t dim,
          bool overlap, const bf16* rows, int64_t ld, int64_t row0, int64_t c_off, int64_t z_off,
          int64_t first, int64_t last, bf16* dst, const int64_t* win_pos) {
    if (last <= first) return;
    const ModelConfig& cfg = W.cfg;
    bf16* out = dst + first * dim;
    oc::compress_pool({ratio, dim, overlap}, rows + c_off, rows + z_off, ld, row0,
                      comp.ape.as<float>(), first, last, out, c.stream);
    oc::rmsnorm_rope(
        out, dim, out, dim, last - first,
        norm_rope(cfg, 1, dim, comp.norm.as<float>(), W.inv_freq_compress, win_pos + first),
        c.stream);
}

// Rows [begin, end) of x [·, width] set to zero.
void zero_rows(const GpuCtx& c, bf16* x, int64_t begin, int64_t end, int64_t width) {
    if (end > begin)
        CPFILL_CUDA_CHECK(
            cudaMemsetAsync(x + begin * width, 0, (end - begin) * width * sizeof(bf16), c.stream));
}

}  // namespace

void gpu_linear(const GpuCtx& c, const GpuMatrix& w, const bf16* x, int64_t ldx, int64_t n,
                bf16* y_bf16, float* y_f32, int64_t ldy) {
    if (!w.fp8()) {
        oc::gemm_bf16(*c.gemm, x, ldx, n, w.cols, w.bf16(), w.rows, y_bf16, y_f32, ldy, false,
                      c.stream);
        return;
    }
    CPFILL_CHECK(c.fp8 != nullptr, "an fp8 weight but no fp8 scratch in the workspace");
    oc::fp8_linear(*c.gemm, *c.fp8, x, ldx, n, w.cols, w.data.as<void>(), w.scale.as<float>(),
                   w.blocks(), w.rows, y_bf16, y_f32, ldy, c.stream);
}

void gpu_attn_pack(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const GpuRows& rows,
                   const bf16* xn, bf16* packed, GpuAttnScratch& s) {
    const ModelConfig& cfg = W.cfg;
    const int64_t n = rows.n, D = cfg.d_model, d = cfg.head_dim;
    const int64_t ld = packed_widths(cfg, L.type).total();
    c.phase(Phase::Attention);
    // Window key: rope(kv_norm(x · wkv)) in column 0 of the packed rows.
    linear(c, xn, n, L.wkv, packed, ld);
    oc::rmsnorm_rope(packed, ld, packed, ld, n,
                     norm_rope(cfg, 1, d, L.kv_norm.as<float>(), inv_freq(W, L), rows.pos),
                     c.stream);
    if (L.type == AttnType::Sliding) return;
    c.phase(Phase::Compressor);
    const bool csa = L.type == AttnType::CSA;
    const int64_t comp = (csa ? 2 : 1) * d;
    linear(c, xn, n, D, L.comp.wkv, comp, packed + d, ld);
    linear(c, xn, n, D, L.comp.wgate, comp, packed + d + comp, ld);
    if (csa) {
        const int64_t idx = 2 * int64_t{cfg.index_head_dim}, off = d + 2 * comp;
        linear(c, xn, n, D, L.idx_comp.wkv, idx, packed + off, ld);
        linear(c, xn, n, D, L.idx_comp.wgate, idx, packed + off + idx, ld);
    }
}

void gpu_attn_queries(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const GpuRows& rows,
                      const bf16* xn, GpuAttnScratch& s) {
    const ModelConfig& cfg = W.cfg;
    const int64_t n = rows.n, D = cfg.d_model;
    const int H = cfg.n_heads, d = cfg.head_dim;
    const int64_t Hd = int64_t{H} * d;
    const float eps = float(cfg.norm_eps);
    c.phase(Phase::Attention);
    linear(c, xn, n, L.wq_a, s.cq, cfg.q_rank);
    oc::rmsnorm(s.cq, n, cfg.q_rank, L.q_norm.as<float>(), eps, s.cq, c.stream);
    // q's per-head RMSNorm and RoPE happen as the attention kernel loads it (gpu_attn_output).
    linear(c, s.cq, n, L.wq_b, s.q, Hd);
    if (L.type != AttnType::CSA) return;
    c.phase(Phase::Indexer);
    const int nI = cfg.index_n_heads, dI = cfg.index_head_dim;
    linear(c, s.cq, n, L.idx_wq_b, s.qI, int64_t{nI} * dI);
    oc::apply_rope(s.qI, n, int64_t{nI} * dI, nI, dI, cfg.rope_dim, inv_freq(W, L).as<float>(),
                   rows.pos, false, c.stream);
    oc::gemm_bf16(*c.gemm, xn, D, n, D, L.idx_weights_proj.as<bf16>(), nI, nullptr, s.wI, nI, false,
                  c.stream);
    oc::scale_f32(s.wI, n * nI, 1.0f / std::sqrt(float(nI)), c.stream);
}

int64_t window_rows(int64_t len, int64_t chunk_tokens, int window) {
    return std::min(len, chunk_tokens + 2 * (int64_t{window} - 1));
}

void gpu_kv_append(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const bf16* rows,
                   int64_t ld, int64_t row0, int64_t pos0, int64_t len, GpuLayerKv& kv,
                   const GpuAttnScratch& s) {
    const ModelConfig& cfg = W.cfg;
    const int64_t d = cfg.head_dim;
    CPFILL_CHECK(kv.n_tokens == pos0, "KV store holds {} tokens but the segment starts at {}",
                 kv.n_tokens, pos0);
    CPFILL_CHECK(row0 >= 0 && row0 <= pos0, "segment rows start at {}, after its position {}", row0,
                 pos0);
    c.phase(Phase::Attention);
    if (pos0 + len - kv.window0 > kv.window_cap) {
        // Keep the window − 1 keys before pos0 (the earliest a query of this segment reads), at
        // the front; window_rows leaves a gap of as many rows between them and their new place.
        const int64_t w0 = std::max<int64_t>(kv.window0, pos0 - (cfg.window - 1));
        const int64_t keep = pos0 - w0, from = w0 - kv.window0;
        CPFILL_CHECK(from >= keep && pos0 + len - w0 <= kv.window_cap,
                     "KV store: the window buffer of {} rows (positions from {}) cannot take "
                     "positions {} to {}",
                     kv.window_cap, kv.window0, pos0, pos0 + len - 1);
        if (keep > 0)
            CPFILL_CUDA_CHECK(cudaMemcpyAsync(kv.window, kv.window + from * d,
                                              keep * d * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                              c.stream));
        kv.window0 = w0;
    }
    oc::copy_cols_bf16(rows + (pos0 - row0) * ld, ld, len, d, kv.window + (pos0 - kv.window0) * d,
                       d, c.stream);
    const int64_t after = pos0 + len;
    if (L.type != AttnType::Sliding) {
        c.phase(Phase::Compressor);
        const bool csa = L.type == AttnType::CSA;
        const int ratio = csa ? cfg.csa_ratio : cfg.hca_ratio;
        const int64_t comp = (csa ? 2 : 1) * d, first = kv.n_entries, last = after / ratio;
        const int64_t* wp = csa ? s.win_pos_csa : s.win_pos_hca;
        pool(c, W, L.comp, ratio, d, csa, rows, ld, row0, d, d + comp, first, last, kv.entries, wp);
        if (csa) {
            const int64_t dI = cfg.index_head_dim, off = d + 2 * comp;
            pool(c, W, L.idx_comp, ratio, dI, true, rows, ld, row0, off, off + 2 * dI, first, last,
                 kv.index_keys, wp);
        }
        kv.n_entries = last;
    }
    kv.n_tokens = after;
}

void gpu_attn_output(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, int layer,
                     const GpuRows& rows, const GpuKvStore& store, GpuAttnScratch& s, bf16* out) {
    const ModelConfig& cfg = W.cfg;
    const int64_t n = rows.n, D = cfg.d_model;
    const int H = cfg.n_heads, d = cfg.head_dim;
    const int64_t Hd = int64_t{H} * d;
    const bool csa = L.type == AttnType::CSA;
    const int ratio = cfg.ratio(layer);
    const int K = cfg.index_topk;
    // The attention writes every row of a segment; the rows between segments (padding) are zeros.
    int64_t covered = 0;
    for (const LocalSegment& seg : rows.segments) {
        zero_rows(c, s.o, covered, seg.begin, Hd);
        covered = seg.end;
    }
    zero_rows(c, s.o, covered, n, Hd);
    if (csa) CPFILL_CUDA_CHECK(cudaMemsetAsync(s.topk, 0xff, n * K * sizeof(int32_t), c.stream));
    for (const LocalSegment& seg : rows.segments) {
        const GpuLayerKv& kv = store[seg.request][layer];
        const int64_t b = seg.begin, m = seg.end - seg.begin;
        if (csa) {
            c.phase(Phase::Indexer);
            oc::IndexerArgs ia;
            ia.q = s.qI + b * cfg.index_n_heads * cfg.index_head_dim;
            ia.weight = s.wI + b * cfg.index_n_heads;
            ia.pos = rows.pos + b;
            ia.n_q = m;
            ia.n_heads = cfg.index_n_heads;
            ia.dim = cfg.index_head_dim;
            ia.keys = kv.index_keys;
            ia.n_entries = kv.n_entries;
            ia.ratio = ratio;
            ia.top_k = K;
            ia.scale = 1.0f / std::sqrt(float(cfg.index_head_dim));
            ia.idx = s.topk + b * K;
            ia.precision = W.indexer_fp8 ? oc::IndexerPrecision::Fp8 : oc::IndexerPrecision::Bf16;
            oc::indexer_topk(ia, s.scores, s.scores_floats, c.stream);
        }
        c.phase(Phase::Attention);
        oc::AttnArgs a;
        a.q = s.q + b * Hd;
        a.pos = rows.pos + b;
        a.n_q = m;
        a.n_heads = H;
        a.head_dim = d;
        a.window = kv.window;
        a.window0 = kv.window0;
        a.window_size = cfg.window;
        if (L.type != AttnType::Sliding) {
            a.entries = kv.entries;
            a.n_entries = kv.n_entries;
            a.ratio = ratio;
        }
        if (csa) {
            a.entry_idx = s.topk + b * K;
            a.idx_stride = K;
        }
        a.sinks = L.sink.as<float>();
        a.scale = 1.0f / std::sqrt(float(d));
        a.out = s.o + b * Hd;
        // q as projected: normed and rotated as it is loaded, the output de-rotated in the kernel.
        a.q_norm = true;
        a.q_norm_eps = float(cfg.norm_eps);
        a.rope_dim = cfg.rope_dim;
        a.inv_freq = inv_freq(W, L).as<float>();
        oc::attention(a, c.stream);
    }
    c.phase(Phase::Attention);
    const int g = cfg.o_groups;
    const int64_t group_in = Hd / g, ro = cfg.o_rank;
    // wo_a: group gi's rows [gi · ro, (gi + 1) · ro) of the weight on columns [gi · group_in, …)
    // of o (ro a multiple of 128 when fp8: its scale tiles are whole row tiles of the group).
    for (int gi = 0; gi < g; ++gi) {
        const GpuMatrix& w = L.wo_a;
        const bf16* x = s.o + gi * group_in;
        if (!w.fp8()) {
            oc::gemm_bf16(*c.gemm, x, Hd, n, group_in, w.bf16() + gi * ro * group_in, ro,
                          s.yo + gi * ro, nullptr, g * ro, false, c.stream);
            continue;
        }
        CPFILL_CHECK(c.fp8 != nullptr, "an fp8 weight but no fp8 scratch in the workspace");
        const int64_t tiles_per_row = oc::fp8_weight_scales(128, group_in, w.blocks());
        oc::fp8_linear(*c.gemm, *c.fp8, x, Hd, n, group_in,
                       w.data.as<uint8_t>() + gi * ro * group_in,
                       w.scale.as<float>() + gi * (ro / 128) * tiles_per_row, w.blocks(), ro,
                       s.yo + gi * ro, nullptr, g * ro, c.stream);
    }
    linear(c, s.yo, n, L.wo_b, out, D);
}

}  // namespace cpfill::cuda
