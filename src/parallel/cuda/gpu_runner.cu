// run_rank: the workspace carved from the arena, the per-sub-batch stages, split-phase
// collectives, the head and the records of one GPU rank.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "core/dtype.h"
#include "model/cuda/gpu_attention.h"
#include "model/cuda/gpu_moe.h"
#include "model/weight_bytes.h"
#include "model/weights.h"
#include "ops/cuda/grouped_fp8.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/moe_dispatch.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rows.h"
#include "parallel/cuda/gpu_runner.h"
#include "parallel/cuda/gpu_workspace.h"
#include "parallel/engine.h"
#include "parallel/exchange_plan.h"
#include "parallel/layout.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace oc = ops::cuda;

void RankDevice::init_streams() {
    streams = std::make_unique<RankStreams>();
    compute = streams->compute;
    comm = streams->comm;
    route = streams->route;
    for (int i = 0; i < kMaxExpertStreams; ++i) {
        experts.stream[i] = streams->experts[i];
        experts.join[i] = streams->expert_join[i].native();
    }
    experts.fork = streams->expert_fork.native();
    use_experts(GpuRunOptions{}.expert_streams, ExpertGemm::Streams, 0);
}

bool grouped_experts(ExpertGemm mode) {
    // Auto takes the faster path as measured (docs/fp8.md): the grouped kernel up to
    // kGroupedFp8MaxMeanRows (fp8, TMA-store epilogue) or kGroupedBf16MaxMeanRows (bf16) rows per
    // expert (use_experts).
    return mode != ExpertGemm::Streams && ops::cuda::grouped_fp8_supported();
}

void RankDevice::use_experts(int streams, ExpertGemm mode, int n_experts) {
    CPFILL_CHECK(streams >= 1 && streams <= kMaxExpertStreams,
                 "expert streams: {}, expected 1 to {}", streams, kMaxExpertStreams);
    while (static_cast<int>(expert_gemms.size()) < streams) {
        expert_gemms.push_back(gemm ? std::make_unique<ops::cuda::GemmContext>(*gemm)
                                    : std::make_unique<ops::cuda::GemmContext>());
        experts.gemm[expert_gemms.size() - 1] = expert_gemms.back().get();
    }
    experts.count = streams;
    experts.grouped = nullptr;
    experts.fp8_grouped = experts.bf16_grouped = grouped_experts(mode);
    experts.bf16_grouped_max_mean_rows = mode == ExpertGemm::Auto ? kGroupedBf16MaxMeanRows : 0;
    experts.fp8_grouped_max_mean_rows = mode == ExpertGemm::Auto ? kGroupedFp8MaxMeanRows : 0;
    if (mode != ExpertGemm::Grouped) return;
    CPFILL_CHECK(n_experts <= kMaxGroupedExperts, "{} routed experts: at most {} supported",
                 n_experts, kMaxGroupedExperts);
    if (!grouped) grouped = std::make_unique<ops::cuda::GroupedGemm>(kMaxGroupedExperts);
    experts.grouped = grouped.get();
}

RankDevice::~RankDevice() {
    if (host_counts) cudaFreeHost(host_counts);
}

void RankDevice::alloc_host_counts(int n_experts) {
    if (host_counts) cudaFreeHost(host_counts);
    host_counts = nullptr;
    CPFILL_CUDA_CHECK(cudaMallocHost(&host_counts, 2 * n_experts * sizeof(int32_t)));
}

namespace {

// dst[0 … n) = the bf16 values src[0 … n) (their bits) as f32: rows downloaded for the host.
void bf16_to_f32_n(const uint16_t* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = cpfill::bf16_to_f32(src[i]);
}

class Runner final : public RankBackend {
  public:
    Runner(RankDevice& dev, const RunPlan& plan, const GpuRunOptions& opt, const AbortFlag& flag,
           std::chrono::milliseconds deadline, PrefillOutput* out)
        : dev_(dev),
          W_(*dev.weights),
          cfg_(W_.cfg),
          plan_(plan),
          opt_(opt),
          out_(out),
          timer_(opt.phase_timing && dev.rank == 0),
          dims_(dims_of(cfg_, plan, dev.cp, opt)) {
        dev.use_experts(opt.expert_streams, opt.expert_gemm, cfg_.n_experts);
        ctx_.stream = dev.compute;
        ctx_.gemm = dev.gemm.get();
        ctx_.flag = &flag;
        ctx_.deadline = deadline;
        ctx_.timer = &timer_;
        route_ctx_ = ctx_;
        route_ctx_.stream = dev.route;
        route_ctx_.gemm = dev.gemm_route.get();
        route_ctx_.timer = nullptr;
    }
    void run(GpuStats* stats);

    // RankBackend (parallel/engine.h)
    void begin_chunk(const ChunkPlan& chunk) override;
    void embedded(int s) override;
    void begin_layer(int layer) override;
    void begin_head() override { timer_.mark_layer(dev_.compute); }
    void head(int s) override;
    void end_chunk() override { timer_.end(dev_.compute); }
    // BlockOps (model/decoder_block.h)
    void collapse(int s, int layer, Site site) override;
    void residual(int s, int layer, Site site) override;
    void residual_collapse(int s, int layer, Site from, int next_layer, Site to) override;
    void attn_pack(int s, int layer) override;
    void attn_queries(int s, int layer) override;
    void kv_append(int s, int layer) override;
    void attn_output(int s, int layer) override;
    void moe_route(int s, int layer) override;
    void moe_experts(int s, int layer) override;
    void start(Exchange e, int s, int layer) override;
    void wait(Exchange e, int s, int layer) override;
    void layer_done(int s, int layer) override;

  private:
    // The rows of sub-batch s whose logits the chunk returns, and where they go: (sub-batch row,
    // request, row of its logits tensor).
    struct Want {
        int64_t row;
        int request;
        int64_t out_row;
    };
    std::vector<Want> wanted_rows(const SubState& s) const;
    // Whether the head runs on this rank's wanted rows alone (wants: wanted_rows(s)): then the
    // last layer's residual update is left to head(), which applies it to those rows only.
    bool head_rows_apart(const SubState& s, const std::vector<Want>& wants) const;
    void setup();
    oc::MhcDeviceParams mhc_params(const GpuMhc& m) const {
        return {
            m.fn.as<float>(), m.base.as<float>(),     m.scale.as<float>(), cfg_.hc,
            cfg_.d_model,     cfg_.hc_sinkhorn_iters, float(cfg_.hc_eps),  float(cfg_.norm_eps)};
    }
    // What an mHC site of sub-batch s reads and writes: its weights, its post / comb (the
    // attention site's are shared scratch, used from its collapse to its residual update; the MoE
    // site's live in the sub-batch from its attention stage to its moe_finish), the sub-block's
    // output the residual update takes, and where the collapse goes after its RMSNorm (the MoE
    // input straight into its all-gather's send buffer).
    struct SiteIo {
        oc::MhcDeviceParams mhc;
        const float* norm;
        float *post, *comb;
        const bf16* block_out;
        bf16* collapse_to;
    };
    // The embedding goes into stream 0 of h alone and the chunk's first site and first boundary
    // read it for every stream (mhc_pre_first, mhc_post_pre_first): with the fused boundary, and
    // unless the residual after the embedding is recorded.
    bool embed_one_stream() const { return opt_.mhc_fused && !opt_.record_hidden; }
    SiteIo site_io(SubState& s, const GpuLayer& L, Site site) const {
        if (site == Site::Attn)
            return {mhc_params(L.hc_attn), L.attn_norm.as<float>(),
                    ws_.post_attn,         ws_.comb_attn,
                    ws_.attn_out,          ws_.x};
        return {mhc_params(L.hc_ffn),
                L.ffn_norm.as<float>(),
                s.post,
                s.comb,
                s.recv[slot(Exchange::MoeSums)],
                s.send[slot(Exchange::MoeInputs)]};
    }
    void record_rows(SubState& s, const void* local, int64_t width, size_t elem, Tensor* dst,
                     bool widen_bf16);
    // The residual h of the local rows (fp32, or bf16 widened) into dst [T, hc, d_model].
    void record_residual(SubState& s, Tensor* dst) {
        record_rows(s, s.h.data, int64_t{cfg_.hc} * cfg_.d_model, s.h.elem_bytes(), dst,
                    s.h.is_bf16);
    }
    void record_kv_tails(SubState& s, int li, const bf16* stage);
    void record_routes(SubState& s, int li);
    void download_kv();

    RankDevice& dev_;
    const GpuWeights& W_;
    const ModelConfig& cfg_;
    const RunPlan& plan_;
    const ChunkPlan* chunk_ = nullptr;  // the chunk being run
    const GpuRunOptions& opt_;
    PrefillOutput* out_;
    PhaseTimer timer_;
    Dims dims_;
    GpuCtx ctx_, route_ctx_;
    Workspace ws_;
    std::array<std::array<CudaEvent, 2>, kExchanges> ready_, done_;  // per (exchange, sub-batch)
    std::array<CudaEvent, 2> mark_, routed_;  // per sub-batch: compute point, routing done
    double arena_seconds_ = 0;                // growing the arena (GpuStats::arena_seconds)
};

void Runner::setup() {
    const int C = dev_.cp;
    const WeightNeeds needs = needs_of(W_);
    // Copy-engine collectives find a peer's buffers at this rank's offsets: every rank plans for
    // the widest expert slice, so that the layouts agree where the slices do not.
    const int64_t width =
        dev_.copy_engines ? slice_width(cfg_.moe_dim, widest_slice(cfg_.moe_dim, C)) : W_.width;
    const size_t need = workspace_bytes(cfg_, plan_, C, width, opt_, needs, dev_.copy_engines);
    if (!dev_.arena || dev_.arena->capacity() < need) {
        const auto t0 = std::chrono::steady_clock::now();
        dev_.arena.reset();
        dev_.arena = std::make_unique<Arena>(need);
        // Zeroed once, so that a timing-only run without collectives never reads garbage.
        CPFILL_CUDA_CHECK(cudaMemsetAsync(dev_.arena->base(), 0, need, dev_.compute));
        arena_seconds_ =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    dev_.arena->reset();
    carve(*dev_.arena, ws_, cfg_, plan_, C, width, opt_, needs, dev_.copy_engines);
    // Copy-engine collectives find the peers' buffers by their offsets in the arena (laid out
    // alike on every rank) and stage reductions in the workspace: registered once per run.
    if (C > 1 && !opt_.no_comm) {
        dev_.cp_comm->use_buffers(dev_.arena->base(), dev_.arena->capacity(), ws_.ce_staging[0],
                                  ws_.ce_staging_bytes, *ctx_.flag, ctx_.deadline);
        dev_.overlap->use_buffers(dev_.arena->base(), dev_.arena->capacity(), ws_.ce_staging[1],
                                  ws_.ce_staging_bytes, *ctx_.flag, ctx_.deadline);
    }
    ctx_.fp8 = needs.dense_fp8 ? &ws_.fp8 : nullptr;
    const cudaStream_t st = dev_.compute;
    const int64_t max_len = dims_.max_len;
    oc::iota_i64(const_cast<int64_t*>(ws_.attn.win_pos_csa), max_len / cfg_.csa_ratio + 1,
                 cfg_.csa_ratio, st);
    oc::iota_i64(const_cast<int64_t*>(ws_.attn.win_pos_hca), max_len / cfg_.hca_ratio + 1,
                 cfg_.hca_ratio, st);
    for (size_t i = 0; i < ws_.subs.size(); ++i)
        ws_.subs[i].route.host_counts = dev_.host_counts + i * cfg_.n_experts;
}

// The chunk's sub-batches into the sub-batch states: layouts, positions, tokens, embeddings (the
// buffers, sized for the largest chunk, stay).
void Runner::begin_chunk(const ChunkPlan& chunk) {
    chunk_ = &chunk;
    const int C = dev_.cp, r = dev_.rank;
    const cudaStream_t st = dev_.compute;
    const int64_t D = cfg_.d_model;
    for (size_t i = 0; i < chunk.subs.size(); ++i) {
        SubState& s = ws_.subs[i];
        s.index = static_cast<int>(i);
        s.row_offset = chunk.row_offset[i];
        s.stream_row0 = chunk.stream_row0 + chunk.row_offset[i];
        s.batch = &chunk.subs[i];
        s.layout = make_layout(*s.batch, C);
        s.rows = s.layout.local_rows(*s.batch, r);
        s.n = s.layout.local();
        s.padded = s.layout.padded;
        const std::vector<int32_t> rm = s.layout.rank_major_tokens(*s.batch);
        // Pageable sources: the copies are done when cudaMemcpyAsync returns.
        CPFILL_CUDA_CHECK(
            cudaMemcpyAsync(s.pos, s.rows.pos.data(), s.n * 8, cudaMemcpyHostToDevice, st));
        CPFILL_CUDA_CHECK(
            cudaMemcpyAsync(s.tokens_rm, rm.data(), s.padded * 4, cudaMemcpyHostToDevice, st));
        CPFILL_CUDA_CHECK(cudaMemcpyAsync(s.tokens_local, s.rows.tokens.data(), s.n * 4,
                                          cudaMemcpyHostToDevice, st));
        s.grows.n = s.n;
        s.grows.pos = s.pos;
        auto& segs = s.grows.segments;
        segs.clear();
        for (int64_t t = 0; t < s.n; ++t) {
            if (!s.rows.valid[t]) continue;
            if (segs.empty() || segs.back().request != s.rows.request[t] || segs.back().end != t)
                segs.push_back({s.rows.request[t], t, t + 1});
            else
                segs.back().end = t + 1;
        }
        s.h.visit([&](auto* h) {
            oc::embed_streams(W_.embed.as<bf16>(), s.tokens_local, s.n, D, cfg_.hc,
                              embed_one_stream() ? 1 : cfg_.hc, h, st);
        });
    }
}

// An exchange's collective: on the compute stream without TBO; with TBO on the comm stream
// through the duplicate communicator, after the compute stream's point where its send buffer was
// written. None with one rank: the workspace made the receive buffer the send buffer.
void Runner::start(Exchange e, int si, int li) {
    SubState& s = ws_.subs[si];
    const size_t k = slot(e);
    if (opt_.no_comm || s.send[k] == s.recv[k]) return;
    const int64_t count = s.n * exchange_width(cfg_, W_.layers[li].type, e);
    const void* send = s.send[k];
    void* recv = s.recv[k];
    const bool scatter = collective_of(e) == Collective::ReduceScatter;
    if (!chunk_->tbo) {
        ctx_.phase(Phase::Collectives);
        if (scatter)
            dev_.cp_comm->reduce_scatter(send, recv, count, CommData::Bf16, dev_.compute);
        else
            dev_.cp_comm->all_gather(send, recv, count, CommData::Bf16, dev_.compute);
        return;
    }
    ready_[k][si].record(dev_.compute);
    ready_[k][si].make_wait(dev_.comm);
    if (scatter)
        dev_.overlap->reduce_scatter(send, recv, count, CommData::Bf16, dev_.comm);
    else
        dev_.overlap->all_gather(send, recv, count, CommData::Bf16, dev_.comm);
    done_[k][si].record(dev_.comm);
}

void Runner::wait(Exchange e, int si, int /*layer*/) {
    const SubState& s = ws_.subs[si];
    if (opt_.no_comm || !chunk_->tbo || s.send[slot(e)] == s.recv[slot(e)]) return;
    ctx_.phase(Phase::Collectives);
    done_[slot(e)][si].make_wait(dev_.compute);
}

void Runner::begin_layer(int li) {
    timer_.mark_layer(dev_.compute);
    CPFILL_CHECK(!(opt_.fail_rank == dev_.rank && li == 1),
                 "injected fault (GpuRunOptions::fail_rank) at layer {}", li);
}

// The first site of a chunk (layer 0's attention site): h is the embedding in every stream
// (begin_chunk; in stream 0 alone where embed_one_stream), so with the fused kernels on,
// mhc_pre_first reads stream 0 alone; otherwise (and at every site with mhc_fused off) mhc_pre and
// the RMSNorm.
void Runner::collapse(int si, int li, Site site) {
    SubState& s = ws_.subs[si];
    const SiteIo io = site_io(s, W_.layers[li], site);
    ctx_.phase(Phase::Other);
    if (opt_.mhc_fused && li == 0 && site == Site::Attn) {
        s.h.visit([&](auto* h) {
            oc::mhc_pre_first(io.mhc, io.norm, float(cfg_.norm_eps), s.n, h, io.post, io.comb,
                              io.collapse_to, ws_.mixes, dev_.compute);
        });
        return;
    }
    if (s.h.is_bf16)  // the dot products in the kernel (no cuBLASLt GEMM takes bf16 by fp32)
        oc::mhc_pre(io.mhc, static_cast<const bf16*>(s.h.data), s.n, io.post, io.comb, ws_.x,
                    dev_.compute);
    else
        oc::mhc_pre(io.mhc, static_cast<const float*>(s.h.data), s.n, io.post, io.comb, ws_.x,
                    *dev_.gemm, ws_.mixes, dev_.compute);
    oc::rmsnorm(ws_.x, s.n, cfg_.d_model, io.norm, float(cfg_.norm_eps), io.collapse_to,
                dev_.compute);
}

void Runner::residual(int si, int li, Site site) {
    SubState& s = ws_.subs[si];
    if (site == Site::Ffn && li == cfg_.n_layers - 1 && head_rows_apart(s, wanted_rows(s))) return;
    const SiteIo io = site_io(s, W_.layers[li], site);
    ctx_.phase(Phase::Other);
    s.h.visit([&](auto* h) {
        oc::mhc_post(io.post, io.comb, io.block_out, cfg_.hc, cfg_.d_model, s.n, h, dev_.compute);
    });
}

// One pass where the site `from` of `layer` hands the residual to the site `to` of `next_layer`:
// the update with the sub-block's output, the next pre-mix and collapse, and its RMSNorm.
void Runner::residual_collapse(int si, int layer, Site from, int next_layer, Site to) {
    if (!opt_.mhc_fused) {
        RankBackend::residual_collapse(si, layer, from, next_layer, to);
        return;
    }
    SubState& s = ws_.subs[si];
    const SiteIo a = site_io(s, W_.layers[layer], from), b = site_io(s, W_.layers[next_layer], to);
    ctx_.phase(Phase::Other);
    const bool first = layer == 0 && from == Site::Attn && embed_one_stream();
    s.h.visit([&](auto* h) {
        if (first)
            oc::mhc_post_pre_first(a.post, a.comb, a.block_out, b.mhc, b.norm, float(cfg_.norm_eps),
                                   s.n, h, b.post, b.comb, b.collapse_to, ws_.mixes, dev_.compute);
        else
            oc::mhc_post_pre(a.post, a.comb, a.block_out, b.mhc, b.norm, float(cfg_.norm_eps), s.n,
                             h, b.post, b.comb, b.collapse_to, ws_.mixes, dev_.compute);
    });
}

void Runner::attn_pack(int si, int li) {
    SubState& s = ws_.subs[si];
    gpu_attn_pack(ctx_, W_, W_.layers[li], s.grows, ws_.x, s.send[slot(Exchange::AttnInputs)],
                  ws_.attn);
}

void Runner::attn_queries(int si, int li) {
    gpu_attn_queries(ctx_, W_, W_.layers[li], ws_.subs[si].grows, ws_.x, ws_.attn);
}

// The gathered attention inputs, rank-major, into the staging buffer in batch order, then each
// segment into its request's KV store. With chunks, the rows before row 0 hold the last rows of
// the chunk before (this layer's): a request continued here may pool windows that began there.
void Runner::kv_append(int si, int li) {
    SubState& s = ws_.subs[si];
    const GpuLayer& L = W_.layers[li];
    const cudaStream_t st = dev_.compute;
    ctx_.phase(Phase::Attention);
    const int64_t width = exchange_width(cfg_, L.type, Exchange::AttnInputs);
    const int64_t ld = dims_.w_max, carry = dims_.carry;
    if (carry > 0 && s.index == 0)
        CPFILL_CUDA_CHECK(cudaMemcpyAsync(ws_.staging - carry * ld, ws_.carry[li],
                                          carry * ld * sizeof(bf16), cudaMemcpyDeviceToDevice, st));
    bf16* stage = ws_.staging + s.row_offset * ld;
    oc::rerange_rows(s.recv[slot(Exchange::AttnInputs)], dev_.cp, s.n, width * 2, s.layout.n_tokens,
                     stage, ld * 2, st);
    for (const Segment& seg : s.batch->segments) {
        // Rows of the request before the segment that the staging buffer holds: the chunk's
        // earlier rows (the other sub-batch's) and the carried ones.
        const int64_t row = s.row_offset + seg.row0;
        const int64_t before = std::min(seg.pos0, row + carry);
        gpu_kv_append(ctx_, W_, L, ws_.staging + (row - before) * ld, ld, seg.pos0 - before,
                      seg.pos0, seg.len, ws_.kv[seg.request][li], ws_.attn);
    }
    if (carry > 0 && s.index + 1 == static_cast<int>(chunk_->subs.size())) {
        const int64_t T = chunk_->batch.n_tokens();
        CPFILL_CUDA_CHECK(cudaMemcpyAsync(ws_.carry[li], ws_.staging + (T - carry) * ld,
                                          carry * ld * sizeof(bf16), cudaMemcpyDeviceToDevice, st));
    }
    if (opt_.record_kv && out_) record_kv_tails(s, li, stage);
}

void Runner::attn_output(int si, int li) {
    SubState& s = ws_.subs[si];
    const GpuLayer& L = W_.layers[li];
    gpu_attn_output(ctx_, W_, L, li, s.grows, ws_.kv, ws_.attn, ws_.attn_out);
    if (opt_.record_topk && L.type == AttnType::CSA)
        record_rows(s, ws_.attn.topk, cfg_.index_topk, 4, out_ ? &out_->topk[li] : nullptr, false);
}

// Routing of sub-batch s on the router stream, as soon as its MoE input has arrived: after this
// point of the compute stream (Y of the previous layer has read the routing buffers) and after the
// gather (on the comm stream with TBO, else in compute order).
void Runner::moe_route(int si, int li) {
    SubState& s = ws_.subs[si];
    mark_[si].record(dev_.compute);
    mark_[si].make_wait(dev_.route);
    const size_t k = slot(Exchange::MoeInputs);
    if (chunk_->tbo && !opt_.no_comm && s.send[k] != s.recv[k]) done_[k][si].make_wait(dev_.route);
    gpu_moe_route(route_ctx_, W_, W_.layers[li], s.recv[slot(Exchange::MoeInputs)], s.tokens_rm,
                  s.padded, s.route);
    routed_[si].record(dev_.route);
}

// This rank's expert slices over every row into the reduce-scatter's send buffer.
void Runner::moe_experts(int si, int li) {
    SubState& s = ws_.subs[si];
    const bf16* y = s.recv[slot(Exchange::MoeInputs)];
    // The shared expert first, on the compute stream after the router's: it needs no routing, so
    // the GPU works while the host waits for the counts and queues the routed experts, whose GEMMs
    // are sized from them.
    gpu_moe_begin(ctx_, dev_.experts, W_, W_.layers[li], y, s.padded, routed_[si].native(),
                  ws_.moe);
    // Polled without sleeping: the host gets here long before the counts (up to a layer ahead),
    // and a sleeping host woke 60–250 µs late, with nothing queued for the GPU to run meanwhile
    // once the shared expert is done or folded (docs/performance-notes.md, session 48).
    wait_event(routed_[si].native(), *ctx_.flag, ctx_.deadline, "MoE routing",
               std::chrono::milliseconds(500));
    gpu_moe_experts(ctx_, dev_.experts, W_, W_.layers[li], y, s.padded, s.route, ws_.moe,
                    s.send[slot(Exchange::MoeSums)]);
    if (opt_.record_topk && out_) record_routes(s, li);
}

// The router's choices of every row (each rank routes all rows: rank 0's, rank-major) into
// out_->routes[li] in batch order. Rank 0 only (out_ is null elsewhere).
void Runner::record_routes(SubState& s, int li) {
    const int64_t K = cfg_.top_k, C = dev_.cp;
    std::vector<int32_t> host(s.padded * K);
    CPFILL_CUDA_CHECK(cudaMemcpyAsync(host.data(), s.route.idx, host.size() * 4,
                                      cudaMemcpyDeviceToHost, dev_.compute));
    wait_stream(dev_.compute, *ctx_.flag, ctx_.deadline, "recording the router's choices");
    int32_t* dst = out_->routes[li].data<int32_t>() + s.stream_row0 * K;
    for (int64_t t = 0; t < s.layout.n_tokens; ++t)
        std::copy_n(host.data() + ((t % C) * s.n + t / C) * K, K, dst + t * K);
}

void Runner::embedded(int si) {
    if (opt_.record_hidden) record_residual(ws_.subs[si], out_ ? &out_->hidden[0] : nullptr);
}

void Runner::layer_done(int si, int li) {
    if (opt_.record_hidden) record_residual(ws_.subs[si], out_ ? &out_->hidden[li + 1] : nullptr);
}

// All-gathers a per-local-row device tensor [n, width] of `elem`-byte values; rank 0 copies the
// rows in batch order into dst (f32 or i32 [T, …]) at the sub-batch's offset (bf16 widened).
void Runner::record_rows(SubState& s, const void* local, int64_t width, size_t elem, Tensor* dst,
                         bool widen_bf16) {
    const cudaStream_t st = dev_.compute;
    const int64_t n = s.n, bytes = width * static_cast<int64_t>(elem);
    ctx_.phase(Phase::Other);
    CPFILL_CUDA_CHECK(
        cudaMemcpyAsync(ws_.rec_send, local, n * bytes, cudaMemcpyDeviceToDevice, st));
    if (!opt_.no_comm)
        dev_.cp_comm->all_gather(ws_.rec_send, ws_.rec_recv, n * bytes, CommData::Bytes, st);
    if (dev_.rank != 0 || dst == nullptr) return;
    std::vector<char> host(s.padded * bytes);
    CPFILL_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), ws_.rec_recv, host.size(), cudaMemcpyDeviceToHost, st));
    wait_stream(st, *ctx_.flag, ctx_.deadline, "recording a hidden state");
    const int C = dev_.cp;
    const int64_t out_elem = widen_bf16 ? 4 : static_cast<int64_t>(elem);
    char* base = static_cast<char*>(dst->raw_mut()) + s.stream_row0 * width * out_elem;
    for (int64_t t = 0; t < s.layout.n_tokens; ++t) {
        const char* src = host.data() + ((t % C) * n + t / C) * bytes;
        if (!widen_bf16) {
            std::memcpy(base + t * bytes, src, bytes);
            continue;
        }
        bf16_to_f32_n(reinterpret_cast<const uint16_t*>(src), width,
                      reinterpret_cast<float*>(base) + t * width);
    }
}

// The compressors' tails of the KV state (kv_store.h: the projections of the tokens after the last
// complete window and, CSA, of that window), from this layer's packed rows while the staging
// buffer still holds them: each sub-batch copies the rows of the tail it has. Rank 0 only.
void Runner::record_kv_tails(SubState& s, int li, const bf16* stage) {
    const AttnType type = W_.layers[li].type;
    if (type == AttnType::Sliding) return;
    const bool csa = type == AttnType::CSA;
    const int64_t ratio = csa ? cfg_.csa_ratio : cfg_.hca_ratio;
    const PackedWidths pw = packed_widths(cfg_, type);
    const int64_t width = pw.total(), ld = dims_.w_max;
    for (const Segment& seg : s.batch->segments) {
        const int64_t len = static_cast<int64_t>((*plan_.requests)[seg.request].size());
        LayerKv& kv = out_->kv[seg.request][li];
        const int64_t tail0 = std::max<int64_t>(0, (len / ratio - (csa ? 1 : 0)) * ratio);
        if (kv.main_tail.kv.empty()) {  // sized once per request and layer
            kv.main_tail.pos0 = kv.index_tail.pos0 = tail0;
            kv.main_tail.kv.assign((len - tail0) * pw.comp, 0.0f);
            kv.main_tail.gate.assign((len - tail0) * pw.comp, 0.0f);
            kv.index_tail.kv.assign((len - tail0) * pw.index, 0.0f);
            kv.index_tail.gate.assign((len - tail0) * pw.index, 0.0f);
        }
        const int64_t a = std::max(seg.pos0, tail0), b = seg.pos0 + seg.len;
        if (a >= b) continue;
        const bf16* rows = stage + (seg.row0 - seg.pos0 + a) * ld;
        std::vector<uint16_t> host((b - a) * width);
        CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(host.data(), width * 2, rows, ld * 2, width * 2, b - a,
                                            cudaMemcpyDeviceToHost, dev_.compute));
        wait_stream(dev_.compute, *ctx_.flag, ctx_.deadline, "downloading the KV state");
        for (int64_t p = a; p < b; ++p) {
            const uint16_t* row = host.data() + (p - a) * width;
            const int64_t t = p - tail0;
            bf16_to_f32_n(row + pw.key, pw.comp, kv.main_tail.kv.data() + t * pw.comp);
            bf16_to_f32_n(row + pw.key + pw.comp, pw.comp, kv.main_tail.gate.data() + t * pw.comp);
            if (!csa) continue;
            const int64_t ci = pw.key + 2 * pw.comp;
            bf16_to_f32_n(row + ci, pw.index, kv.index_tail.kv.data() + t * pw.index);
            bf16_to_f32_n(row + ci + pw.index, pw.index, kv.index_tail.gate.data() + t * pw.index);
        }
    }
}

// The rest of the KV state after the last layer: the last window − 1 keys, the compressed entries
// and the indexer keys of every request and layer, widened to f32. Rank 0 only.
void Runner::download_kv() {
    const int64_t d = cfg_.head_dim, dI = cfg_.index_head_dim;
    const auto fetch = [&](const bf16* src, int64_t n) {
        std::vector<uint16_t> host(n);
        if (n > 0) {
            CPFILL_CUDA_CHECK(
                cudaMemcpyAsync(host.data(), src, n * 2, cudaMemcpyDeviceToHost, dev_.compute));
            wait_stream(dev_.compute, *ctx_.flag, ctx_.deadline, "downloading the KV state");
        }
        std::vector<float> out(n);
        bf16_to_f32_n(host.data(), n, out.data());
        return out;
    };
    for (size_t r = 0; r < out_->kv.size(); ++r)
        for (int li = 0; li < cfg_.n_layers; ++li) {
            const GpuLayerKv& g = ws_.kv[r][li];
            LayerKv& kv = out_->kv[r][li];
            kv.n_tokens = g.n_tokens;
            const int64_t keep = std::min<int64_t>(g.n_tokens, cfg_.window - 1);
            kv.window0 = g.n_tokens - keep;
            CPFILL_CHECK(kv.window0 >= g.window0,
                         "KV state: the last {} window keys of {} are "
                         "not in the buffer (it holds positions from {})",
                         keep, g.n_tokens, g.window0);
            kv.window = fetch(g.window + (kv.window0 - g.window0) * d, keep * d);
            if (W_.layers[li].type == AttnType::Sliding) continue;
            kv.n_entries = g.n_entries;
            kv.entries = fetch(g.entries, g.n_entries * d);
            if (W_.layers[li].type == AttnType::CSA)
                kv.index_keys = fetch(g.index_keys, g.n_entries * dI);
        }
}

std::vector<Runner::Want> Runner::wanted_rows(const SubState& s) const {
    std::vector<Want> wants;
    for (const Segment& seg : s.batch->segments) {
        const int64_t len = static_cast<int64_t>((*plan_.requests)[seg.request].size());
        if (opt_.all_logits) {
            for (int64_t i = 0; i < seg.len; ++i)
                wants.push_back({seg.row0 + i, seg.request, seg.pos0 + i});
        } else if (seg.pos0 + seg.len == len) {
            wants.push_back({seg.row0 + seg.len - 1, seg.request, 0});
        }
    }
    return wants;
}

// The final residual update, the head's mHC collapse and the final RMSNorm over every local row
// cost ≈ 6 ms at 64k tokens (one H100, session 33's profile: mhc_post 3.4 ms, the head's
// collapse ≈ 4) where only each request's last row is wanted. When the wanted rows are few (at
// most kHeadRowsApart and at most 1/16 of the local rows) and nothing records the residual, head()
// runs the same kernels on each wanted row alone — per row the same operations in the same order,
// so the logits are bit for bit those of the whole-chunk path (GpuPrefill.LastRowsAloneEqual…).
bool Runner::head_rows_apart(const SubState& s, const std::vector<Want>& wants) const {
    constexpr int64_t kHeadRowsApart = 32;
    if (opt_.all_logits || opt_.record_hidden) return false;
    int64_t local = 0;
    for (const Want& w : wants) local += w.row % dev_.cp == dev_.rank;
    return local <= kHeadRowsApart && local * 16 <= s.n;
}

void Runner::head(int si) {
    SubState& s = ws_.subs[si];
    const cudaStream_t st = dev_.compute;
    const int64_t n = s.n, D = cfg_.d_model, V = cfg_.vocab_size, hc = cfg_.hc;
    const int C = dev_.cp, r = dev_.rank;
    ctx_.phase(Phase::Other);
    const std::vector<Want> wants = wanted_rows(s);
    const int64_t nw = static_cast<int64_t>(wants.size());
    const float* hc_fn = W_.hc_head_fn.as<float>();
    const float* hc_base = W_.hc_head_base.as<float>();
    const float* hc_scale = W_.hc_head_scale.as<float>();
    // z_row[i]: the row of z that holds want i's final hidden row on this rank (−1: another
    // rank's).
    std::vector<int64_t> z_row(nw, -1);
    if (head_rows_apart(s, wants)) {
        // Each wanted local row alone: the last layer's residual update (residual() left it)
        // and the collapse, into z's rows 0, 1, …
        const SiteIo io = site_io(s, W_.layers[cfg_.n_layers - 1], Site::Ffn);
        int64_t k = 0;
        for (int64_t i = 0; i < nw; ++i) {
            const int64_t g = wants[i].row;
            if (g % C != r) continue;
            const int64_t j = g / C;
            s.h.visit([&](auto* h) {
                oc::mhc_post(io.post + j * hc, io.comb + j * hc * hc, io.block_out + j * D, cfg_.hc,
                             D, 1, h + j * hc * D, st);
                oc::mhc_head(hc_fn, hc_base, hc_scale, cfg_.hc, D, float(cfg_.hc_eps),
                             float(cfg_.norm_eps), h + j * hc * D, 1, ws_.z + k * D, st);
            });
            z_row[i] = k++;
        }
        oc::rmsnorm(ws_.z, k, D, W_.norm.as<float>(), float(cfg_.norm_eps), ws_.z, st);
    } else {
        s.h.visit([&](auto* h) {
            oc::mhc_head(hc_fn, hc_base, hc_scale, cfg_.hc, D, float(cfg_.hc_eps),
                         float(cfg_.norm_eps), h, n, ws_.z, st);
        });
        oc::rmsnorm(ws_.z, n, D, W_.norm.as<float>(), float(cfg_.norm_eps), ws_.z, st);
        if (opt_.record_hidden)
            record_rows(s, ws_.z, D, 2, out_ ? &out_->hidden.back() : nullptr, true);
        for (int64_t i = 0; i < nw; ++i)
            if (wants[i].row % C == r) z_row[i] = wants[i].row / C;
    }
    if (nw == 0) return;
    CPFILL_CUDA_CHECK(cudaMemsetAsync(ws_.zw, 0, nw * D * sizeof(bf16), st));
    for (int64_t i = 0; i < nw; ++i)
        if (z_row[i] >= 0)
            CPFILL_CUDA_CHECK(cudaMemcpyAsync(ws_.zw + i * D, ws_.z + z_row[i] * D,
                                              D * sizeof(bf16), cudaMemcpyDeviceToDevice, st));
    if (!opt_.no_comm && C > 1)
        dev_.cp_comm->all_reduce(ws_.zw, ws_.zw, nw * D, CommData::Bf16, st);
    if (r != 0) return;
    const int64_t chunk = dims_.logit_rows;
    std::vector<float> host(chunk * V);
    for (int64_t i0 = 0; i0 < nw; i0 += chunk) {
        const int64_t m = std::min(chunk, nw - i0);
        oc::linear_bf16(*dev_.gemm, ws_.zw + i0 * D, m, D, W_.head.as<bf16>(), V, nullptr,
                        ws_.logits, false, st);
        if (!out_) continue;
        CPFILL_CUDA_CHECK(cudaMemcpyAsync(host.data(), ws_.logits, m * V * sizeof(float),
                                          cudaMemcpyDeviceToHost, st));
        wait_stream(st, *ctx_.flag, ctx_.deadline, "downloading logits");
        for (int64_t i = 0; i < m; ++i) {
            const Want& w = wants[i0 + i];
            float* dst = out_->logits[w.request].f32() + w.out_row * V;
            std::memcpy(dst, host.data() + i * V, V * sizeof(float));
        }
    }
}

void Runner::run(GpuStats* stats) {
    setup();
    run_plan(*this, plan_, cfg_.n_layers);
    wait_stream(dev_.compute, *ctx_.flag, ctx_.deadline, "the prefill");
    wait_stream(dev_.comm, *ctx_.flag, ctx_.deadline, "the comm stream");
    wait_stream(dev_.route, *ctx_.flag, ctx_.deadline, "the router stream");
    if (opt_.record_kv && out_) download_kv();
    if (stats) stats->arena_seconds = arena_seconds_;
    if (stats && timer_.enabled()) {
        const std::vector<double> p = timer_.phase_seconds();
        stats->phases.attention = p[static_cast<int>(Phase::Attention)];
        stats->phases.indexer = p[static_cast<int>(Phase::Indexer)];
        stats->phases.compressor = p[static_cast<int>(Phase::Compressor)];
        stats->phases.moe = p[static_cast<int>(Phase::Moe)];
        stats->phases.collectives = p[static_cast<int>(Phase::Collectives)];
        stats->phases.other = p[static_cast<int>(Phase::Other)];
        // Marks before each layer and the head of every chunk: a layer's seconds summed over
        // the chunks.
        const std::vector<double> marks = timer_.layer_seconds();
        const size_t L = static_cast<size_t>(cfg_.n_layers);
        stats->layer_seconds.assign(L, 0.0);
        for (size_t i = 0; i < marks.size(); ++i)
            if (i % (L + 1) < L) stats->layer_seconds[i % (L + 1)] += marks[i];
    }
}

}  // namespace

void run_rank(RankDevice& dev, const RunPlan& plan, const GpuRunOptions& opt, const AbortFlag& flag,
              std::chrono::milliseconds deadline, PrefillOutput* out, GpuStats* stats) {
    Runner runner(dev, plan, opt, flag, deadline, out);
    runner.run(stats);
}

}  // namespace cpfill::cuda
