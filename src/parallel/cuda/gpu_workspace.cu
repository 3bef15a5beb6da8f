// The workspace plan: the sizes of one run (dims_of), carve, and the byte counts of
// the memory plan (workspace_bytes, weight_bytes).
#include <algorithm>

#include "model/kv_store.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/moe_dispatch.h"
#include "ops/cuda/moe_fp8.h"
#include "parallel/cuda/gpu_workspace.h"
#include "runtime/cuda/sm90.h"

namespace cpfill::cuda {

namespace oc = ops::cuda;

int64_t max_packed_width(const ModelConfig& cfg) {
    int64_t w = 0;
    for (AttnType t : cfg.layer_types) w = std::max(w, packed_widths(cfg, t).total());
    return w;
}

int64_t carry_rows(const ModelConfig& cfg) {
    return std::max<int64_t>(2 * int64_t{cfg.csa_ratio}, cfg.hca_ratio);
}

Dims dims_of(const ModelConfig& cfg, const RunPlan& plan, int cp, const GpuRunOptions& opt) {
    Dims d;
    for (const ChunkPlan& c : plan.chunks) {
        for (size_t i = 0; i < c.subs.size(); ++i) {
            const CpLayout l = make_layout(c.subs[i], cp);
            d.sub_n[i] = std::max(d.sub_n[i], l.local());
            d.sub_p[i] = std::max(d.sub_p[i], l.padded);
            d.n_max = std::max(d.n_max, l.local());
            d.p_max = std::max(d.p_max, l.padded);
        }
        d.T = std::max(d.T, c.batch.n_tokens());
    }
    d.w_max = max_packed_width(cfg);
    d.carry = plan.chunks.size() > 1 ? carry_rows(cfg) : 0;
    for (const auto& r : *plan.requests) d.max_len = std::max<int64_t>(d.max_len, r.size());
    d.n_wanted = opt.all_logits ? d.T : static_cast<int64_t>(plan.requests->size());
    d.logit_rows = std::clamp<int64_t>((int64_t{256} << 20) / (cfg.vocab_size * 4), 1, d.n_wanted);
    d.index_entries = d.max_len / std::max(1, cfg.csa_ratio) + 1;
    d.score_rows =
        std::clamp<int64_t>((int64_t{1} << 26) / d.index_entries, 1, std::max<int64_t>(d.n_max, 1));
    return d;
}

// The workspace of one run, carved in one fixed order from an arena (or counted).
WeightNeeds needs_of(const GpuWeights& w) {
    WeightNeeds n{w.dense_fp8(), w.experts_fp8(), w.experts_fp4()};
    n.indexer_fp8 = w.indexer_fp8;
    n.shared_apart = false;
    for (const GpuLayer& L : w.layers) {
        const bool folded = shared_expert_folded(L);
        n.shared_folded |= folded;
        n.shared_apart |= !folded;
    }
    return n;
}

WeightNeeds needs_of(const ModelConfig& cfg, ExpertSlice slice, GpuWeightFormat format,
                     GpuIndexer indexer) {
    WeightNeeds n;
    n.indexer_fp8 = gpu_indexer_fp8(indexer, format, current_device_is_sm90());
    if (format == GpuWeightFormat::Bf16) return n;
    // Per layer: its routed experts fp8 or fp4, its shared expert's matrices all fp8.
    std::vector<char> routed(cfg.n_layers, 0), shared(cfg.n_layers, 1);
    for (const WeightSpec& spec : weight_specs(cfg)) {
        const GpuStorage st = gpu_storage(spec, cfg, slice, format);
        if (st == GpuStorage::Fp4) n.experts_fp4 = n.experts_fp8 = true;
        const bool fp8 = is_fp8(st) || st == GpuStorage::Fp4;
        if (spec.expert >= 0 && fp8) routed[spec.layer] = 1;
        if (spec.expert < 0 && is_expert_weight(spec) && !is_fp8(st)) shared[spec.layer] = 0;
        if (!is_fp8(st)) continue;
        (spec.expert >= 0 ? n.experts_fp8 : n.dense_fp8) = true;
    }
    n.shared_apart = false;
    for (int li = 0; li < cfg.n_layers; ++li) {
        const bool folded = routed[li] && shared[li];
        n.shared_folded |= folded;
        n.shared_apart |= !folded;
    }
    return n;
}

template <class A>
void carve(A& a, Workspace& w, const ModelConfig& cfg, const RunPlan& plan, int cp, int64_t width,
           const GpuRunOptions& opt, WeightNeeds needs, bool copy_engines) {
    const Dims d = dims_of(cfg, plan, cp, opt);
    const int64_t D = cfg.d_model, hc = cfg.hc, Hd = int64_t{cfg.n_heads} * cfg.head_dim;
    const int64_t K = cfg.top_k, E = cfg.n_experts;
    const size_t n_subs = plan.tbo() ? 2 : 1;
    w.subs.resize(n_subs);
    for (size_t i = 0; i < n_subs; ++i) {
        SubState& s = w.subs[i];
        const int64_t n = d.sub_n[i], P = d.sub_p[i];  // the largest over the chunks
        s.h.is_bf16 = opt.residual == ResidualDtype::Bf16;
        if (s.h.is_bf16)
            s.h.data = a.template take<bf16>(n * hc * D);
        else
            s.h.data = a.template take<float>(n * hc * D);
        s.post = a.template take<float>(n * hc);
        s.comb = a.template take<float>(n * hc * hc);
        s.pos = a.template take<int64_t>(n);
        s.tokens_rm = a.template take<int32_t>(P);
        s.tokens_local = a.template take<int32_t>(n);
        for (Exchange e : {Exchange::AttnInputs, Exchange::MoeInputs, Exchange::MoeSums}) {
            int64_t width = 0;  // the widest layer's
            for (AttnType t : cfg.layer_types) width = std::max(width, exchange_width(cfg, t, e));
            const bool gather = collective_of(e) == Collective::AllGather;
            s.send[slot(e)] = a.template take<bf16>((gather ? n : P) * width);
            // One rank: the exchange moves nothing, its consumer reads the send buffer (the
            // runner skips the collective when the two are one).
            s.recv[slot(e)] = cp == 1 && P == n ? s.send[slot(e)]
                                                : a.template take<bf16>((gather ? P : n) * width);
        }
        GpuRouteScratch& r = s.route;
        r.logits = a.template take<float>(P * E);
        r.hash = a.template take<int64_t>(P * K);
        r.idx = a.template take<int32_t>(P * K);
        r.weight = a.template take<float>(P * K);
        r.perm = a.template take<int32_t>(P * K);
        r.keys = a.template take<int32_t>(P * K);
        r.ids = a.template take<int32_t>(P * K);
        r.counts = a.template take<int32_t>(E);
        r.sort_bytes = oc::sort_scratch_bytes(P * K, static_cast<int>(E));
        r.sort_scratch = a.template take<char>(static_cast<int64_t>(r.sort_bytes));
    }
    const int64_t n = d.n_max, P = d.p_max;
    w.x = a.template take<bf16>(n * D);
    w.post_attn = a.template take<float>(n * hc);
    w.comb_attn = a.template take<float>(n * hc * hc);
    // mhc_pre's mixing products, or the fused post + pre's partial sums (whichever is larger).
    w.mixes = a.template take<float>(
        std::max(n * (2 + hc) * hc, oc::mhc_post_pre_scratch_bytes(cfg.hc, D, n) / 4));
    w.attn_out = a.template take<bf16>(n * D);
    // The carried rows sit just before row 0 of the staging buffer.
    w.staging = a.template take<bf16>((d.carry + d.T + cp) * d.w_max);
    if (w.staging) w.staging += d.carry * d.w_max;
    w.carry.assign(d.carry > 0 ? cfg.n_layers : 0, nullptr);
    for (bf16*& c : w.carry) c = a.template take<bf16>(d.carry * d.w_max);
    GpuAttnScratch& s = w.attn;
    s.cq = a.template take<bf16>(n * cfg.q_rank);
    s.q = a.template take<bf16>(n * Hd);
    s.o = a.template take<bf16>(n * Hd);
    s.yo = a.template take<bf16>(n * cfg.o_groups * cfg.o_rank);
    s.qI = a.template take<bf16>(n * cfg.index_n_heads * cfg.index_head_dim);
    s.wI = a.template take<float>(n * cfg.index_n_heads);
    s.topk = a.template take<int32_t>(n * cfg.index_topk);
    s.scores_floats = oc::indexer_scratch_floats(
        needs.indexer_fp8 ? oc::IndexerPrecision::Fp8 : oc::IndexerPrecision::Bf16, d.index_entries,
        d.score_rows);
    s.scores = a.template take<float>(s.scores_floats);
    s.win_pos_csa = a.template take<int64_t>(d.max_len / cfg.csa_ratio + 1);
    s.win_pos_hca = a.template take<int64_t>(d.max_len / cfg.hca_ratio + 1);
    GpuMoeScratch& m = w.moe;
    const int64_t R = needs.experts_fp8 ? oc::max_padded_rows(P * K, static_cast<int>(E)) +
                                              (needs.shared_folded ? oc::padded_rows(P) : 0)
                                        : P * K;
    m.inv = a.template take<int32_t>(P * K);
    m.sp = a.template take<float>(R);
    m.gu = a.template take<bf16>(R * 2 * width);
    m.op = a.template take<bf16>(R * D);
    m.first = a.template take<int32_t>(E + 2);
    m.pfirst = a.template take<int32_t>(E + 2);
    if (needs.experts_fp8) {
        m.xq = a.template take<uint8_t>(R * D);
        m.xs = a.template take<float>(R * D / 128);
        m.aq = a.template take<uint8_t>(R * width);
        m.as = a.template take<float>(R * width / 128);
        if (needs.experts_fp4) {
            const auto t = ops::Fp8Blocks::Tile128;
            m.w13_q = a.template take<uint8_t>(E * 2 * width * D);
            m.w13_s = a.template take<float>(E * ops::fp8_scale_count(2 * width, D, t));
            m.w2_q = a.template take<uint8_t>(E * D * width);
            m.w2_s = a.template take<float>(E * ops::fp8_scale_count(D, width, t));
            m.tile_k = a.template take<int>(oc::fp4_tile_scratch(E, 2 * width, D) +
                                            oc::fp4_tile_scratch(E, D, width));
        }
    } else {
        m.xp = a.template take<bf16>(R * D);
        m.act = a.template take<bf16>(R * width);
    }
    if (needs.dense_fp8) {
        // The largest activation an fp8 linear quantises: local rows into the attention
        // projections, or all rows into a shared expert that is not folded in.
        const int64_t g = cfg.o_groups,
                      in_local = std::max({D, int64_t{cfg.q_rank}, Hd / g, g * cfg.o_rank});
        oc::Fp8LinearScratch& f = w.fp8;
        f.capacity = std::max(n * in_local, needs.shared_apart ? P * std::max(D, width) : 0);
        f.cols = std::max(in_local, width);
        f.out = std::max({int64_t{cfg.q_rank}, Hd, int64_t{cfg.head_dim}, int64_t{cfg.o_rank}, D,
                          int64_t{cfg.index_n_heads} * cfg.index_head_dim, 2 * width});
        f.q = a.template take<uint8_t>(f.capacity);
        f.scale = a.template take<float>(f.capacity / 128 + 1);
        f.tail_q = a.template take<uint8_t>(4 * f.cols);
        f.tail_scale = a.template take<float>(4 * f.cols / 128 + 1);
        f.tail_y = a.template take<float>(4 * f.out);
    }
    if (needs.shared_apart) {
        m.gu_shared = a.template take<bf16>(P * 2 * width);
        m.act_shared = a.template take<bf16>(P * width);
        m.acc = a.template take<float>(P * D);
    }
    w.kv.assign(plan.requests->size(), std::vector<GpuLayerKv>(cfg.n_layers));
    for (size_t r = 0; r < plan.requests->size(); ++r) {
        const int64_t len = static_cast<int64_t>((*plan.requests)[r].size());
        for (int li = 0; li < cfg.n_layers; ++li) {
            GpuLayerKv& kv = w.kv[r][li];
            kv.window_cap = window_rows(len, d.T, cfg.window);
            kv.window = a.template take<bf16>(kv.window_cap * cfg.head_dim);
            const int ratio = cfg.ratio(li);
            if (ratio > 0) kv.entries = a.template take<bf16>(len / ratio * cfg.head_dim);
            if (cfg.layer_types[li] == AttnType::CSA)
                kv.index_keys = a.template take<bf16>(len / ratio * cfg.index_head_dim);
        }
    }
    w.z = a.template take<bf16>(n * D);
    w.zw = a.template take<bf16>(d.n_wanted * D);
    w.logits = a.template take<float>(d.logit_rows * cfg.vocab_size);
    if (opt.record_hidden || opt.record_topk) {
        const int64_t rw = std::max<int64_t>(hc * D, cfg.index_topk);
        w.rec_send = a.template take<float>(n * rw);
        w.rec_recv = a.template take<float>(P * rw);
    }
    // The largest reduction: the MoE sums (n local rows) or the head's all-reduce (n_wanted).
    w.ce_staging_bytes =
        comm_staging_bytes(copy_engines, cp, std::max(n, d.n_wanted) * D, CommData::Bf16);
    if (w.ce_staging_bytes)
        for (void*& st : w.ce_staging)
            st = a.template take<char>(static_cast<int64_t>(w.ce_staging_bytes));
}

template void carve<Arena>(Arena&, Workspace&, const ModelConfig&, const RunPlan&, int, int64_t,
                           const GpuRunOptions&, WeightNeeds, bool);
template void carve<CountingArena>(CountingArena&, Workspace&, const ModelConfig&, const RunPlan&,
                                   int, int64_t, const GpuRunOptions&, WeightNeeds, bool);

size_t workspace_bytes(const ModelConfig& cfg, const RunPlan& plan, int cp, int64_t width,
                       const GpuRunOptions& opt, const WeightNeeds& needs, bool copy_engines) {
    CountingArena a;
    Workspace w;
    carve(a, w, cfg, plan, cp, width, opt, needs, copy_engines);
    return a.used;
}

}  // namespace cpfill::cuda
