// cp_prefill: rank threads, each a CPU backend of the one engine (parallel/engine.h): the block's
// ops on fp32 host rows, the exchanges through split-phase collectives, and the head.
#include "parallel/cp_prefill.h"

#include <array>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "model/attention.h"
#include "model/moe.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "parallel/collectives.h"
#include "parallel/engine.h"
#include "parallel/exchange_plan.h"
#include "parallel/layout.h"

namespace cpfill {

namespace {

ops::MhcParams mhc_params(const MhcWeights& m, const ModelConfig& cfg) {
    return {m.fn.f32(),  m.base.f32(),          m.scale.f32(),     cfg.hc,
            cfg.d_model, cfg.hc_sinkhorn_iters, float(cfg.hc_eps), float(cfg.norm_eps)};
}

// One sub-batch on one rank: its layout, local rows, residual and scratch.
struct Sub {
    int index = 0;
    int64_t row_offset = 0;  // first row of this sub-batch in the whole token stream
    const Batch* batch = nullptr;
    CpLayout layout;
    Rows rows;
    std::vector<int32_t> tokens_rm;  // all padded rows' tokens, rank-major
    std::vector<float> h;            // [n_local, hc, d_model]
    std::vector<float> post, comb, x, mix, normed, out, global;
    AttnScratch attn;
    std::array<const float*, kExchanges> received{};  // by slot(), after wait()
};

// One CPU rank as the engine's backend (parallel/engine.h): the block's ops on fp32 host rows.
class RankRunner final : public RankBackend {
  public:
    RankRunner(RankContext& ctx, const ModelWeights& w, const PrefillOptions& opt, ThreadPool& pool,
               int n_requests, PrefillOutput* collect)
        : ctx_(ctx),
          w_(w),
          cfg_(w.cfg),
          opt_(opt),
          pool_(pool),
          ropes_(cfg_),
          store_(n_requests, std::vector<LayerKv>(cfg_.n_layers)),
          collect_(collect) {}

    void run(const RunPlan& plan) {
        requests_ = plan.requests;
        for (const ChunkPlan& c : plan.chunks) {
            coll_ = std::make_unique<SplitCollectives>(ctx_, c.tbo);
            run_chunk(*this, c, cfg_.n_layers);
        }
    }
    KvStore& store() { return store_; }

    void begin_chunk(const ChunkPlan& chunk) override;
    void embedded(int s) override { record_hidden(subs_[s], 0); }
    void head(int s) override;

    void collapse(int s, int layer, Site site) override;
    void residual(int s, int layer, Site site) override;
    void attn_pack(int s, int layer) override;
    void attn_queries(int s, int layer) override;
    void kv_append(int s, int layer) override;
    void attn_output(int s, int layer) override;
    void moe_experts(int s, int layer) override;
    void start(Exchange e, int s, int layer) override;
    void wait(Exchange e, int s, int layer) override;
    void layer_done(int s, int layer) override { record_hidden(subs_[s], layer + 1); }

  private:
    int64_t width(Exchange e, int layer) const {
        return exchange_width(cfg_, w_.layers[layer].type, e);
    }
    // Gathers a per-local-row tensor [n_local, width] into global order [T, width] (s.global), on
    // the CP communicator from the compute stream (records only).
    const float* gather_rows(Sub& s, const float* local, int64_t width);
    void record_hidden(Sub& s, int index);

    RankContext& ctx_;
    const ModelWeights& w_;
    const ModelConfig& cfg_;
    const PrefillOptions& opt_;
    ThreadPool& pool_;
    RopeTables ropes_;
    KvStore store_;
    PrefillOutput* collect_;  // rank 0 only: where logits and records go
    const std::vector<std::vector<int32_t>>* requests_ = nullptr;
    std::unique_ptr<SplitCollectives> coll_;
    std::array<Sub, 2> subs_;
    std::vector<float> gathered_;  // gather_rows' receive buffer
};

// PrefillOptions::residual bf16: every value of h rounded to bf16 (to nearest even).
void round_to_bf16(std::vector<float>& h) {
    for (float& v : h) v = bf16_to_f32(f32_to_bf16(v));
}

void RankRunner::begin_chunk(const ChunkPlan& chunk) {
    const int64_t D = cfg_.d_model, hc = cfg_.hc;
    for (size_t i = 0; i < chunk.subs.size(); ++i) {
        Sub& s = subs_[i];
        s.index = static_cast<int>(i);
        s.row_offset = chunk.stream_row0 + chunk.row_offset[i];
        s.batch = &chunk.subs[i];
        s.layout = make_layout(*s.batch, ctx_.cp_size);
        s.rows = s.layout.local_rows(*s.batch, ctx_.rank);
        s.tokens_rm = s.layout.rank_major_tokens(*s.batch);
        const int64_t n = s.rows.n();
        s.h.resize(n * hc * D);
        for (int64_t t = 0; t < n; ++t)
            for (int j = 0; j < hc; ++j)
                std::memcpy(&s.h[(t * hc + j) * D], w_.embed.f32() + int64_t{s.rows.tokens[t]} * D,
                            D * sizeof(float));
        if (opt_.residual == ResidualDtype::Bf16) round_to_bf16(s.h);
        s.post.resize(n * hc);
        s.comb.resize(n * hc * hc);
        s.x.resize(n * D);
        s.mix.resize(n * (2 + hc) * hc);
        s.normed.resize(n * hc * D);
        s.out.resize(n * D);
    }
}

const float* RankRunner::gather_rows(Sub& s, const float* local, int64_t width) {
    const int64_t n = s.rows.n();
    gathered_.resize(ctx_.cp_size * n * width);
    ctx_.cp->all_gather(local, gathered_.data(), n * width, *ctx_.compute);
    ctx_.compute->synchronize(ctx_.deadline);
    s.global.resize(s.layout.n_tokens * width);
    rerange(gathered_.data(), ctx_.cp_size, n, width, s.layout.n_tokens, s.global.data());
    return s.global.data();
}

void RankRunner::record_hidden(Sub& s, int index) {
    if (!opt_.record_hidden) return;
    const int64_t width = cfg_.hc * cfg_.d_model;
    const float* g = gather_rows(s, s.h.data(), width);
    if (!collect_) return;
    Tensor& t = collect_->hidden[index];
    std::memcpy(t.f32() + s.row_offset * width, g, s.layout.n_tokens * width * sizeof(float));
}

void RankRunner::collapse(int si, int li, Site site) {
    Sub& s = subs_[si];
    const LayerWeights& L = w_.layers[li];
    const int64_t n = s.rows.n(), D = cfg_.d_model;
    const bool attn = site == Site::Attn;
    ops::mhc_pre(mhc_params(attn ? L.hc_attn : L.hc_ffn, cfg_), s.h.data(), n, s.post.data(),
                 s.comb.data(), s.x.data(), s.mix.data(), s.normed.data(), pool_);
    // The MoE input goes straight into its all-gather's send buffer.
    float* dst = attn ? s.x.data() : coll_->send(Exchange::MoeInputs, si, n * D);
    ops::rmsnorm(s.x.data(), n, D, (attn ? L.attn_norm : L.ffn_norm).f32(), float(cfg_.norm_eps),
                 dst);
}

void RankRunner::residual(int si, int /*layer*/, Site site) {
    Sub& s = subs_[si];
    const float* o =
        site == Site::Attn ? s.out.data() : s.received[slot(Exchange::MoeSums)];  // [n_local, D]
    ops::mhc_post(s.post.data(), s.comb.data(), o, cfg_.hc, cfg_.d_model, s.rows.n(), s.h.data(),
                  pool_);
    if (opt_.residual == ResidualDtype::Bf16) round_to_bf16(s.h);
}

void RankRunner::attn_pack(int si, int li) {
    Sub& s = subs_[si];
    const int64_t n = s.rows.n(), wd = width(Exchange::AttnInputs, li);
    cpfill::attn_pack(w_.layers[li], cfg_, ropes_, s.rows, s.x.data(),
                      coll_->send(Exchange::AttnInputs, si, n * wd), pool_);
}

void RankRunner::attn_queries(int si, int li) {
    Sub& s = subs_[si];
    cpfill::attn_queries(w_.layers[li], cfg_, ropes_, s.rows, s.x.data(), s.attn, pool_);
}

// The gathered attention inputs, rank-major, into batch order, then each segment into its
// request's KV store.
void RankRunner::kv_append(int si, int li) {
    Sub& s = subs_[si];
    const LayerWeights& L = w_.layers[li];
    const int64_t n = s.rows.n(), wd = width(Exchange::AttnInputs, li);
    s.global.resize(s.layout.n_tokens * wd);
    rerange(s.received[slot(Exchange::AttnInputs)], ctx_.cp_size, n, wd, s.layout.n_tokens,
            s.global.data());
    for (const Segment& seg : s.batch->segments) {
        LayerKv& kv = store_[seg.request][li];
        CPFILL_CHECK(kv.n_tokens == seg.pos0,
                     "request {} layer {}: segment starts at {} but the KV store holds {} tokens",
                     seg.request, li, seg.pos0, kv.n_tokens);
        cpfill::kv_append(kv, L, cfg_, ropes_.for_layer(L.type), s.global.data() + seg.row0 * wd,
                          wd, seg.len);
    }
}

void RankRunner::attn_output(int si, int li) {
    Sub& s = subs_[si];
    const LayerWeights& L = w_.layers[li];
    const int64_t n = s.rows.n();
    std::vector<int32_t> topk;
    if (opt_.record_topk && L.type == AttnType::CSA) topk.resize(n * cfg_.index_topk);
    cpfill::attn_output(L, li, cfg_, ropes_, s.rows, store_, s.attn, s.out.data(),
                        topk.empty() ? nullptr : topk.data(), pool_);
    if (topk.empty()) return;
    std::vector<float> as_float(topk.begin(), topk.end());
    const float* gt = gather_rows(s, as_float.data(), cfg_.index_topk);
    if (!collect_) return;
    int32_t* dst = collect_->topk[li].data<int32_t>() + s.row_offset * cfg_.index_topk;
    for (int64_t i = 0; i < s.layout.n_tokens * cfg_.index_topk; ++i)
        dst[i] = static_cast<int32_t>(gt[i]);
}

// This rank's expert slices over the MoE input of all rows → its partial sums, into the
// reduce-scatter's send buffer.
void RankRunner::moe_experts(int si, int li) {
    Sub& s = subs_[si];
    const LayerWeights& L = w_.layers[li];
    const int64_t n = s.rows.n(), D = cfg_.d_model, all = s.layout.padded;
    const float* y_all = s.received[slot(Exchange::MoeInputs)];  // [padded, D]
    float* partial = coll_->send(Exchange::MoeSums, si, n * D);
    std::vector<int32_t> routes(opt_.record_topk && collect_ ? all * cfg_.top_k : 0);
    moe_forward(L, cfg_, y_all, s.tokens_rm.data(), all, partial, pool_,
                routes.empty() ? nullptr : routes.data());
    if (routes.empty()) return;
    // rank-major rows → batch order (token t is row (t % C) · n + t / C)
    const int64_t C = s.layout.cp_size, K = cfg_.top_k;
    int32_t* dst = collect_->routes[li].data<int32_t>() + s.row_offset * K;
    for (int64_t t = 0; t < s.layout.n_tokens; ++t)
        std::copy_n(routes.data() + ((t % C) * n + t / C) * K, K, dst + t * K);
}

void RankRunner::start(Exchange e, int si, int li) {
    coll_->launch(e, si, subs_[si].rows.n() * width(e, li));
}

void RankRunner::wait(Exchange e, int si, int /*layer*/) {
    subs_[si].received[slot(e)] = coll_->finish(e, si);
}

void RankRunner::head(int si) {
    Sub& s = subs_[si];
    const int64_t n = s.rows.n(), D = cfg_.d_model, V = cfg_.vocab_size;
    std::vector<float> z(n * D);
    ops::mhc_head(w_.hc_head_fn.f32(), w_.hc_head_base.f32(), w_.hc_head_scale.f32(), cfg_.hc, D,
                  float(cfg_.hc_eps), float(cfg_.norm_eps), s.h.data(), n, z.data(),
                  s.normed.data(), pool_);
    ops::rmsnorm(z.data(), n, D, w_.norm.f32(), float(cfg_.norm_eps), z.data());
    const float* zg = gather_rows(s, z.data(), D);  // [T, D] in batch order
    if (!collect_) return;
    PrefillOutput& out = *collect_;
    if (opt_.record_hidden)
        std::memcpy(out.hidden.back().f32() + s.row_offset * D, zg,
                    s.layout.n_tokens * D * sizeof(float));
    for (const Segment& seg : s.batch->segments) {
        const int64_t len = static_cast<int64_t>((*requests_)[seg.request].size());
        const bool last = seg.pos0 + seg.len == len;
        if (!opt_.all_logits && !last) continue;
        const int64_t first = opt_.all_logits ? 0 : seg.len - 1;
        float* dst = out.logits[seg.request].f32() + (opt_.all_logits ? seg.pos0 * V : 0);
        ops::linear(pool_, zg + (seg.row0 + first) * D, seg.len - first, D, w_.head.f32(), V, dst);
    }
}

}  // namespace

const char* residual_dtype_name(ResidualDtype d) {
    return d == ResidualDtype::Bf16 ? "bf16" : "fp32";
}

ResidualDtype parse_residual_dtype(const std::string& name) {
    if (name == "fp32") return ResidualDtype::Fp32;
    if (name == "bf16") return ResidualDtype::Bf16;
    CPFILL_FAIL("residual dtype \"{}\": expected fp32 or bf16", name);
}

bool tbo_pays(const ModelConfig& cfg, int64_t n_tokens, int cp) {
    // Each sub-batch needs at least C tokens (one per rank) and enough rows that splitting the
    // GEMMs in two costs little; below that the saved collective time cannot pay for the extra
    // synchronisation. A measured cost model replaces this with the CUDA backend.
    const int64_t per_sub = n_tokens / 2;
    return cp > 1 && per_sub >= std::max<int64_t>(cp, 256) && cfg.n_layers > 0;
}

PrefillOutput make_prefill_output(const ModelConfig& cfg,
                                  const std::vector<std::vector<int32_t>>& requests,
                                  bool all_logits, bool record_hidden, bool record_topk) {
    PrefillOutput out;
    int64_t total = 0;
    for (const auto& r : requests) total += static_cast<int64_t>(r.size());
    out.n_tokens = total;
    for (const auto& r : requests)
        out.logits.push_back(
            Tensor::zeros(DType::F32, all_logits ? Shape{int64_t(r.size()), cfg.vocab_size}
                                                 : Shape{cfg.vocab_size}));
    if (record_hidden) {
        for (int i = 0; i <= cfg.n_layers; ++i)
            out.hidden.push_back(Tensor::zeros(DType::F32, {total, cfg.hc, cfg.d_model}));
        out.hidden.push_back(Tensor::zeros(DType::F32, {total, cfg.d_model}));
    }
    if (record_topk)
        for (int i = 0; i < cfg.n_layers; ++i) {
            out.topk.push_back(cfg.layer_types[i] == AttnType::CSA
                                   ? Tensor::zeros(DType::I32, {total, cfg.index_topk})
                                   : Tensor());
            out.routes.push_back(Tensor::zeros(DType::I32, {total, cfg.top_k}));
        }
    return out;
}

double gpu_tbo_gain_seconds(const ModelConfig& cfg, int64_t n_tokens, int cp,
                            const TboCostModel& m) {
    if (cp < 2) return 0.0;
    const double share = double(cp - 1) / cp;  // of each gathered / scattered byte that moves
    double gain = 0;
    for (int li = 0; li < cfg.n_layers; ++li) {
        // bf16 values per token of the layer's exchanges (exchange_plan.h).
        int64_t widths = 0;
        for (Exchange e : {Exchange::AttnInputs, Exchange::MoeInputs, Exchange::MoeSums})
            widths += exchange_width(cfg, cfg.layer_types[li], e);
        const double comm = double(widths) * 2 * n_tokens * share / (m.busbw_gbps * 1e9);
        const double split = 2.0 * cfg.n_experts * m.split_overhead_s;  // w13 and w2 per expert
        gain += comm - split;
    }
    return gain;
}

bool gpu_tbo_pays(const ModelConfig& cfg, int64_t n_tokens, int cp, const TboCostModel& m) {
    return n_tokens / 2 >= cp && gpu_tbo_gain_seconds(cfg, n_tokens, cp, m) > 0;
}

PrefillOutput cp_prefill(const std::vector<const ModelWeights*>& rank_weights,
                         const std::vector<std::vector<int32_t>>& requests,
                         const PrefillOptions& opt) {
    const int C = opt.cp;
    CPFILL_CHECK(C >= 1 && static_cast<int>(rank_weights.size()) == C,
                 "cp size {} but weights for {} ranks", C, rank_weights.size());
    const ModelConfig& cfg = rank_weights[0]->cfg;
    const RunPlan plan =
        make_run_plan(requests, cfg, C, opt.tbo, opt.chunk, tbo_pays);  // validates
    PrefillOutput out =
        make_prefill_output(cfg, requests, opt.all_logits, opt.record_hidden, opt.record_topk);
    if (plan.chunks.size() > 1) out.chunk = opt.chunk;
    out.tbo_used = plan.tbo();

    ops::set_blas_threads(1);  // parallelism comes from the ranks' pools (ops/linear.h)
    auto comms = make_local_communicators(C, opt.comm);
    std::vector<std::unique_ptr<Communicator>> overlaps(C);
    const int total_threads = opt.threads > 0 ? opt.threads : default_thread_count();
    std::mutex err_mu;
    std::exception_ptr first_error;
    std::vector<std::thread> threads;
    // dup() is collective: every rank calls it before starting, in rank threads.
    for (int r = 0; r < C; ++r) {
        threads.emplace_back([&, r] {
            try {
                overlaps[r] = comms[r]->dup();
                Stream compute("compute/" + std::to_string(r), Stream::Kind::Inline);
                Stream comm("comm/" + std::to_string(r), Stream::Kind::Worker);
                RankContext ctx{r,        C,     comms[r].get(),   overlaps[r].get(),
                                &compute, &comm, opt.comm.deadline};
                ThreadPool pool(std::max(1, total_threads / C));
                RankRunner runner(ctx, *rank_weights[r], opt, pool,
                                  static_cast<int>(requests.size()), r == 0 ? &out : nullptr);
                runner.run(plan);
                comm.synchronize(opt.comm.deadline);
                if (r == 0) out.kv = std::move(runner.store());
            } catch (const std::exception& e) {
                {
                    std::lock_guard<std::mutex> lock(err_mu);
                    if (!first_error) first_error = std::current_exception();
                }
                comms[r]->abort(e.what());
                if (overlaps[r]) overlaps[r]->abort(e.what());
            }
        });
    }
    for (auto& t : threads) t.join();
    if (first_error) std::rethrow_exception(first_error);
    return out;
}

}  // namespace cpfill
