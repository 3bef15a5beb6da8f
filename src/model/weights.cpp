// load_weights: fetches every tensor by canonical name (the Checkpoint resolves naming schemes,
// dequantises and checks shapes), concatenates w1/w3 and slices experts for tensor parallelism.
#include "model/weights.h"

#include <cstring>

#include "io/checkpoint.h"

namespace cpfill {

namespace {

// Rows [begin, end) of a 2-D tensor.
Tensor row_slice(const Tensor& t, int64_t begin, int64_t end) {
    const int64_t cols = t.dim(1);
    Tensor out = Tensor::empty(DType::F32, {end - begin, cols});
    std::memcpy(out.f32(), t.f32() + begin * cols, (end - begin) * cols * sizeof(float));
    return out;
}

// Columns [begin, end) of a 2-D tensor.
Tensor col_slice(const Tensor& t, int64_t begin, int64_t end) {
    const int64_t rows = t.dim(0), cols = t.dim(1), w = end - begin;
    Tensor out = Tensor::empty(DType::F32, {rows, w});
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out.f32() + r * w, t.f32() + r * cols + begin, w * sizeof(float));
    return out;
}

// [w1 slice; w3 slice] and the matching w2 columns.
void load_swiglu(const Checkpoint& ck, const std::string& prefix, const ExpertSlice& s,
                 int64_t moe_dim, Tensor& w13, Tensor& w2) {
    const int64_t b = moe_dim * s.part / s.parts, e = moe_dim * (s.part + 1) / s.parts;
    const int64_t width = e - b;
    Tensor w1 = row_slice(ck.get_f32(prefix + "w1.weight"), b, e);
    Tensor w3 = row_slice(ck.get_f32(prefix + "w3.weight"), b, e);
    const int64_t d = w1.dim(1);
    w13 = Tensor::empty(DType::F32, {2 * width, d});
    std::memcpy(w13.f32(), w1.f32(), w1.nbytes());
    std::memcpy(w13.f32() + width * d, w3.f32(), w3.nbytes());
    w2 = col_slice(ck.get_f32(prefix + "w2.weight"), b, e);
}

CompressorWeights load_compressor(const Checkpoint& ck, const std::string& p) {
    return {ck.get_f32(p + "wkv.weight"), ck.get_f32(p + "wgate.weight"), ck.get_f32(p + "ape"),
            ck.get_f32(p + "norm.weight")};
}

MhcWeights load_mhc(const Checkpoint& ck, const std::string& p) {
    return {ck.get_f32(p + "_fn"), ck.get_f32(p + "_base"), ck.get_f32(p + "_scale")};
}

LayerWeights load_layer(const Checkpoint& ck, const ModelConfig& cfg, int i,
                        const ExpertSlice& slice) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.type = cfg.layer_types[i];
    L.mlp = cfg.mlp_types[i];
    L.hc_attn = load_mhc(ck, p + "hc_attn");
    L.hc_ffn = load_mhc(ck, p + "hc_ffn");
    L.attn_norm = ck.get_f32(p + "attn_norm.weight");
    L.ffn_norm = ck.get_f32(p + "ffn_norm.weight");
    AttentionWeights& a = L.attn;
    const std::string pa = p + "attn.";
    a.wq_a = ck.get_f32(pa + "wq_a.weight");
    a.q_norm = ck.get_f32(pa + "q_norm.weight");
    a.wq_b = ck.get_f32(pa + "wq_b.weight");
    a.wkv = ck.get_f32(pa + "wkv.weight");
    a.kv_norm = ck.get_f32(pa + "kv_norm.weight");
    a.wo_a = ck.get_f32(pa + "wo_a.weight");
    a.wo_b = ck.get_f32(pa + "wo_b.weight");
    a.sink = ck.get_f32(pa + "attn_sink");
    if (L.type != AttnType::Sliding) a.compressor = load_compressor(ck, pa + "compressor.");
    if (L.type == AttnType::CSA) {
        a.idx_wq_b = ck.get_f32(pa + "indexer.wq_b.weight");
        a.idx_weights_proj = ck.get_f32(pa + "indexer.weights_proj.weight");
        a.idx_compressor = load_compressor(ck, pa + "indexer.compressor.");
    }
    MoeWeights& m = L.moe;
    const std::string pf = p + "ffn.";
    m.gate = ck.get_f32(pf + "gate.weight");
    if (L.mlp == MlpType::Hash)
        m.tid2eid = ck.get_i64(pf + "gate.tid2eid");
    else
        m.gate_bias = ck.get_f32(pf + "gate.bias");
    m.w13.resize(cfg.n_experts);
    m.w2.resize(cfg.n_experts);
    for (int e = 0; e < cfg.n_experts; ++e)
        load_swiglu(ck, pf + "experts." + std::to_string(e) + ".", slice, cfg.moe_dim, m.w13[e],
                    m.w2[e]);
    load_swiglu(ck, pf + "shared_experts.", slice, cfg.moe_dim, m.shared_w13, m.shared_w2);
    return L;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ck, ExpertSlice slice) {
    const ModelConfig& cfg = ck.config();
    CPFILL_CHECK(slice.parts >= 1 && slice.part >= 0 && slice.part < slice.parts,
                 "expert slice {} of {} is out of range", slice.part, slice.parts);
    CPFILL_CHECK(cfg.moe_dim >= slice.parts,
                 "moe_intermediate_size {} cannot be split over {} ranks", cfg.moe_dim,
                 slice.parts);
    ModelWeights w;
    w.cfg = cfg;
    w.slice = slice;
    w.embed = ck.get_f32("embed.weight");
    w.head = ck.get_f32("head.weight");
    w.norm = ck.get_f32("norm.weight");
    w.hc_head_fn = ck.get_f32("hc_head_fn");
    w.hc_head_base = ck.get_f32("hc_head_base");
    w.hc_head_scale = ck.get_f32("hc_head_scale");
    for (int i = 0; i < cfg.n_layers; ++i) w.layers.push_back(load_layer(ck, cfg, i, slice));
    return w;
}

namespace {

// Rows [b, e) of the w1 half and of the w3 half of a [2·width, d] [w1; w3] tensor.
Tensor w13_slice(const Tensor& w13, int64_t b, int64_t e) {
    const int64_t width = w13.dim(0) / 2, d = w13.dim(1), n = e - b;
    Tensor out = Tensor::empty(DType::F32, {2 * n, d});
    std::memcpy(out.f32(), w13.f32() + b * d, n * d * sizeof(float));
    std::memcpy(out.f32() + n * d, w13.f32() + (width + b) * d, n * d * sizeof(float));
    return out;
}

}  // namespace

ModelWeights slice_experts(const ModelWeights& full, ExpertSlice slice) {
    CPFILL_CHECK(full.slice.parts == 1, "slice_experts needs fully loaded experts");
    const int64_t moe_dim = full.cfg.moe_dim;
    CPFILL_CHECK(
        slice.parts >= 1 && slice.part >= 0 && slice.part < slice.parts && moe_dim >= slice.parts,
        "cannot split moe_intermediate_size {} into {} slices (slice {})", moe_dim, slice.parts,
        slice.part);
    ModelWeights w = full;  // tensors are shared, not copied
    w.slice = slice;
    if (slice.parts == 1) return w;
    // Slice p holds hidden units [moe_dim·p/parts, moe_dim·(p+1)/parts): even when parts does not
    // divide moe_dim, the partial sums over all slices add up to the full expert output.
    const int64_t b = moe_dim * slice.part / slice.parts,
                  e = moe_dim * (slice.part + 1) / slice.parts;
    for (LayerWeights& L : w.layers) {
        for (size_t x = 0; x < L.moe.w13.size(); ++x) {
            L.moe.w13[x] = w13_slice(L.moe.w13[x], b, e);
            L.moe.w2[x] = col_slice(L.moe.w2[x], b, e);
        }
        L.moe.shared_w13 = w13_slice(L.moe.shared_w13, b, e);
        L.moe.shared_w2 = col_slice(L.moe.shared_w2, b, e);
    }
    return w;
}

size_t ModelWeights::bytes() const {
    size_t n = embed.nbytes() + head.nbytes() + norm.nbytes() + hc_head_fn.nbytes();
    for (const auto& L : layers) {
        for (const Tensor* t :
             {&L.hc_attn.fn, &L.hc_ffn.fn, &L.attn.wq_a, &L.attn.wq_b, &L.attn.wkv, &L.attn.wo_a,
              &L.attn.wo_b, &L.attn.compressor.wkv, &L.attn.compressor.wgate, &L.attn.idx_wq_b,
              &L.attn.idx_weights_proj, &L.attn.idx_compressor.wkv, &L.attn.idx_compressor.wgate,
              &L.moe.gate, &L.moe.shared_w13, &L.moe.shared_w2})
            n += t->nbytes();
        for (const auto& t : L.moe.w13) n += t.nbytes();
        for (const auto& t : L.moe.w2) n += t.nbytes();
    }
    return n;
}

}  // namespace cpfill
