// load_weights: fetches every tensor by canonical name (the Checkpoint resolves naming schemes,
// dequantises and checks shapes), concatenates w1/w3 and slices experts for tensor parallelism.
// load_rank_weights: the same tensors for all CP ranks at once, as a list of block reads into
// preallocated tensors run by a thread pool (docs/loading.md).
#include "model/weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/host_memory.h"
#include "core/parallel.h"
#include "io/checkpoint.h"
#include "io/progress.h"
#include "io/weight_specs.h"

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

// The prefix of an expert's tensor names ("layers.3.ffn.experts.7."), from its w1 / w2 / w3 name.
std::string expert_prefix(const WeightSpec& spec) {
    return spec.name.substr(0, spec.name.size() - std::string_view("w1.weight").size());
}

// Layer metadata and the per-expert vectors sized; the tensors stay empty.
void init_layer(LayerWeights& L, const ModelConfig& cfg, int i) {
    L.type = cfg.layer_types[i];
    L.mlp = cfg.mlp_types[i];
    L.moe.w13.resize(cfg.n_experts);
    L.moe.w2.resize(cfg.n_experts);
}

}  // namespace

Tensor* tensor_slot(ModelWeights& w, const WeightSpec& spec) {
    using S = WeightSlot;
    if (spec.layer < 0) {
        switch (spec.slot) {
            case S::Embed:
                return &w.embed;
            case S::Norm:
                return &w.norm;
            case S::Head:
                return &w.head;
            case S::HcHeadFn:
                return &w.hc_head_fn;
            case S::HcHeadBase:
                return &w.hc_head_base;
            case S::HcHeadScale:
                return &w.hc_head_scale;
            default:
                break;
        }
        CPFILL_FAIL("weight {}: no top-level field for its slot", spec.name);
    }
    CPFILL_CHECK(spec.layer < static_cast<int>(w.layers.size()),
                 "weight {}: the weights hold {} layers", spec.name, w.layers.size());
    return tensor_slot(w.layers[spec.layer], spec);
}

Tensor* tensor_slot(LayerWeights& L, const WeightSpec& spec) {
    using S = WeightSlot;
    AttentionWeights& a = L.attn;
    MoeWeights& m = L.moe;
    switch (spec.slot) {
        case S::HcAttnFn:
            return &L.hc_attn.fn;
        case S::HcAttnBase:
            return &L.hc_attn.base;
        case S::HcAttnScale:
            return &L.hc_attn.scale;
        case S::HcFfnFn:
            return &L.hc_ffn.fn;
        case S::HcFfnBase:
            return &L.hc_ffn.base;
        case S::HcFfnScale:
            return &L.hc_ffn.scale;
        case S::AttnNorm:
            return &L.attn_norm;
        case S::FfnNorm:
            return &L.ffn_norm;
        case S::Sink:
            return &a.sink;
        case S::WqA:
            return &a.wq_a;
        case S::QNorm:
            return &a.q_norm;
        case S::WqB:
            return &a.wq_b;
        case S::Wkv:
            return &a.wkv;
        case S::KvNorm:
            return &a.kv_norm;
        case S::WoA:
            return &a.wo_a;
        case S::WoB:
            return &a.wo_b;
        case S::CompWkv:
            return &a.compressor.wkv;
        case S::CompWgate:
            return &a.compressor.wgate;
        case S::CompApe:
            return &a.compressor.ape;
        case S::CompNorm:
            return &a.compressor.norm;
        case S::IdxWqB:
            return &a.idx_wq_b;
        case S::IdxWeightsProj:
            return &a.idx_weights_proj;
        case S::IdxCompWkv:
            return &a.idx_compressor.wkv;
        case S::IdxCompWgate:
            return &a.idx_compressor.wgate;
        case S::IdxCompApe:
            return &a.idx_compressor.ape;
        case S::IdxCompNorm:
            return &a.idx_compressor.norm;
        case S::Gate:
            return &m.gate;
        case S::GateBias:
            return &m.gate_bias;
        case S::Tid2eid:
            return &m.tid2eid;
        case S::W1:
        case S::W3: {  // both halves of [w1; w3]
            const int e = spec.expert;
            return e < 0 ? &m.shared_w13 : e < static_cast<int>(m.w13.size()) ? &m.w13[e] : nullptr;
        }
        case S::W2: {
            const int e = spec.expert;
            return e < 0 ? &m.shared_w2 : e < static_cast<int>(m.w2.size()) ? &m.w2[e] : nullptr;
        }
        default:
            break;
    }
    CPFILL_FAIL("weight {}: no layer field for its slot", spec.name);
}

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
    w.layers.resize(cfg.n_layers);
    for (int i = 0; i < cfg.n_layers; ++i) init_layer(w.layers[i], cfg, i);
    for (const WeightSpec& spec : ck.specs().all()) {
        if (spec.shard == CpShard::Replicated) {
            *tensor_slot(w, spec) =
                spec.cls == WeightClass::I64 ? ck.get_i64(spec.name) : ck.get_f32(spec.name);
        } else if (spec.slot == WeightSlot::W1) {  // w1, w3 and w2 of this expert at once
            MoeWeights& m = w.layers[spec.layer].moe;
            const int e = spec.expert;
            load_swiglu(ck, expert_prefix(spec), slice, cfg.moe_dim,
                        e < 0 ? m.shared_w13 : m.w13[e], e < 0 ? m.shared_w2 : m.w2[e]);
        }
    }
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

namespace {

// Asks for transparent huge pages behind a fresh output buffer (its 2 MiB-aligned interior):
// first-touch page faults, which otherwise cost more than the dequantisation, drop 512-fold.
// Advice only: without THP (or on other systems) nothing changes.
Tensor empty_f32(Shape shape) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
#ifdef MADV_HUGEPAGE
    constexpr uintptr_t kHuge = uintptr_t{2} << 20;
    const auto p = reinterpret_cast<uintptr_t>(t.raw());
    const uintptr_t b = (p + kHuge - 1) & ~(kHuge - 1), e = (p + t.nbytes()) & ~(kHuge - 1);
    if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#endif
    return t;
}

// All reads of a load as tasks: a block of a weight dequantised into preallocated memory, cut so
// that no task is much larger than kChunkBytes of fp32 (the pool balances them dynamically).
class LoadPlan {
  public:
    explicit LoadPlan(const Checkpoint& ck) : ck_(ck) {}

    Tensor whole(const std::string& name) {  // f32 with the weight's logical shape
        const Shape& shape = ck_.specs().at(name).shape;
        Tensor t = empty_f32(shape);
        const int64_t rows = shape[0], cols = rows ? t.numel() / rows : 0;
        const int64_t step = std::max<int64_t>(1, kChunkBytes / (4 * std::max<int64_t>(cols, 1)));
        for (int64_t r = 0; r < rows; r += step)
            block(name, r, std::min(rows, r + step), 0, cols, t.f32() + r * cols);
        return t;
    }
    // [w1 rows [b, e); w3 rows [b, e)]: f32 [2 (e - b), d_model].
    Tensor w13(const std::string& prefix, int64_t b, int64_t e) {
        const int64_t n = e - b, d = ck_.specs().at(prefix + "w1.weight").shape[1];
        Tensor t = empty_f32({2 * n, d});
        block(prefix + "w1.weight", b, e, 0, d, t.f32());
        block(prefix + "w3.weight", b, e, 0, d, t.f32() + n * d);
        return t;
    }
    // w2 columns [b, e): f32 [d_model, e - b].
    Tensor w2(const std::string& prefix, int64_t b, int64_t e) {
        const int64_t d = ck_.specs().at(prefix + "w2.weight").shape[0];
        Tensor t = empty_f32({d, e - b});
        block(prefix + "w2.weight", 0, d, b, e, t.f32());
        return t;
    }
    void integers(const std::string& name, Tensor* out) {
        tasks_.push_back({name, 0, 0, 0, 0, nullptr, out, stored_share(name, 1)});
        stored_bytes_ += tasks_.back().stored_bytes;
    }

    // Runs every task on `threads` threads, the disk reading ahead of them; returns the stored
    // bytes read. Progress goes to `shared_bar` when given, else to a line of its own.
    size_t run(int threads, bool progress, Progress* shared_bar) {
        Progress own("loading", shared_bar ? 0 : stored_bytes_, progress && !shared_bar);
        Progress& bar = shared_bar ? *shared_bar : own;
        end_bytes_.resize(tasks_.size());
        for (size_t i = 0, sum = 0; i < tasks_.size(); ++i)
            end_bytes_[i] = sum += tasks_[i].stored_bytes;
        ahead_ = kPrefetchBytesPerThread * static_cast<size_t>(threads);
        std::atomic<size_t> next{0};
        std::atomic<bool> failed{false};
        ThreadPool pool(threads);
        pool.parallel_for(pool.size(), [&](int64_t, int64_t) {
            for (size_t i = next++; i < tasks_.size() && !failed; i = next++) {
                try {
                    prefetch_for(i);
                    run_task(tasks_[i]);
                } catch (...) {
                    failed = true;  // the others stop at their next task; the pool rethrows
                    throw;
                }
                bar.add(tasks_[i].stored_bytes);
            }
        });
        return stored_bytes_;
    }
    size_t f32_bytes() const { return f32_bytes_; }

  private:
    static constexpr int64_t kChunkBytes = int64_t{32} << 20;            // fp32 per task
    static constexpr size_t kPrefetchBytesPerThread = size_t{64} << 20;  // stored, ahead

    // Rows [r0, r1) × columns [c0, c1) of weight `name` into dst, or the integer table into
    // i64_out.
    struct Task {
        std::string name;
        int64_t r0, r1, c0, c1;
        float* dst;
        Tensor* i64_out;
        size_t stored_bytes;  // this task's share of the weight's stored bytes
    };

    // Before task i runs: asks the OS to read the stored bytes of task i and of the tasks after it
    // up to ahead_ bytes further (once each), so that the disk works while threads dequantise.
    void prefetch_for(size_t i) {
        std::lock_guard<std::mutex> lock(prefetch_mu_);
        for (; prefetched_ < tasks_.size() &&
               (prefetched_ <= i || end_bytes_[prefetched_] <= end_bytes_[i] + ahead_);
             ++prefetched_) {
            const Task& t = tasks_[prefetched_];
            if (!t.i64_out) ck_.prefetch(t.name, t.r0, t.r1);
        }
    }
    void run_task(const Task& t) const {
        if (t.i64_out)
            *t.i64_out = ck_.get_i64(t.name);
        else
            ck_.read_f32_block(t.name, t.r0, t.r1, t.c0, t.c1, t.dst);
    }
    // The share `fraction` of `name`'s stored bytes (fp8 tiles touched twice count once).
    size_t stored_share(const std::string& name, double fraction) const {
        return static_cast<size_t>(static_cast<double>(ck_.stored(name).bytes) * fraction);
    }
    void block(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
               float* dst) {
        const WeightSpec& spec = ck_.specs().at(name);
        int64_t numel = 1;
        for (int64_t d : spec.shape) numel *= d;
        const int64_t n = (r1 - r0) * (c1 - c0);
        tasks_.push_back({name, r0, r1, c0, c1, dst, nullptr,
                          stored_share(name, static_cast<double>(n) / numel)});
        stored_bytes_ += tasks_.back().stored_bytes;
        f32_bytes_ += static_cast<size_t>(n) * 4;
    }

    const Checkpoint& ck_;
    std::vector<Task> tasks_;
    size_t stored_bytes_ = 0, f32_bytes_ = 0;
    // Read-ahead state of run().
    std::vector<size_t> end_bytes_;  // stored bytes of tasks [0, i]
    size_t ahead_ = 0;
    std::mutex prefetch_mu_;
    size_t prefetched_ = 0;  // tasks [0, prefetched_) have been prefetched (under prefetch_mu_)
};

// Every replicated (non-expert) weight of `part` into `dense` (which must stay where it is until
// the plan has run: tid2eid is written into it).
void plan_dense(LoadPlan& p, const Checkpoint& ck, const LoadPart& part, ModelWeights& dense) {
    for (const WeightSpec& spec : ck.specs().all()) {
        if (spec.shard != CpShard::Replicated) continue;
        if (spec.layer < 0 ? !part.top : !part.has_layer(spec.layer)) continue;
        Tensor* t = tensor_slot(dense, spec);
        if (spec.cls == WeightClass::I64)
            p.integers(spec.name, t);
        else
            *t = p.whole(spec.name);
    }
}

// Every rank's slice of the shared and routed experts of the layers of `part`; the ranks' reads of
// one expert are planned next to each other, so they touch the same stored pages one after
// another.
void plan_experts(LoadPlan& p, const Checkpoint& ck, const LoadPart& part,
                  std::vector<ModelWeights>& ranks) {
    const ModelConfig& cfg = ck.config();
    for (const WeightSpec& spec : ck.specs().all()) {
        if (spec.shard == CpShard::Replicated || spec.slot == WeightSlot::W3)
            continue;  // W3: in W1
        if (!part.has_layer(spec.layer)) continue;
        for (ModelWeights& w : ranks) {
            // Slice r of C holds hidden units [moe_dim·r/C, moe_dim·(r+1)/C), as in
            // slice_experts.
            const int r = w.slice.part, C = w.slice.parts;
            const int64_t b = cfg.moe_dim * r / C, end = cfg.moe_dim * (r + 1) / C;
            *tensor_slot(w, spec) = spec.slot == WeightSlot::W1 ? p.w13(expert_prefix(spec), b, end)
                                                                : p.w2(expert_prefix(spec), b, end);
        }
    }
}

double gb(size_t bytes) { return static_cast<double>(bytes) * 1e-9; }

// `only_ranks`, or every rank of the group when it is empty.
std::vector<int> ranks_or_all(const std::vector<int>& only_ranks, int cp_size) {
    std::vector<int> which = only_ranks;
    if (which.empty())
        for (int r = 0; r < cp_size; ++r) which.push_back(r);
    return which;
}

// Refuses a load that would not fit into host memory, with the numbers and what to change.
void check_host_memory(const ModelConfig& cfg, int cp_size, const std::vector<int>& ranks,
                       const LoadOptions& opt) {
    std::optional<HostMemory> have;
    if (opt.host_memory)
        have = HostMemory{*opt.host_memory, "LoadOptions::host_memory"};
    else
        have = host_memory_available();
    if (!have) return;
    const size_t need = rank_weights_host_bytes(cfg, cp_size, ranks, opt.part);
    if (need <= have->available) return;
    const size_t dense = rank_weights_host_bytes(cfg, cp_size, {}, opt.part);
    const LoadPart& p = opt.part;
    const bool all_layers = p.layer_begin <= 0 && (p.layer_end < 0 || p.layer_end >= cfg.n_layers);
    const int last = p.layer_end < 0 ? cfg.n_layers - 1 : std::min(p.layer_end, cfg.n_layers) - 1;
    std::string what;  // the part, when it is not the whole model
    if (last < p.layer_begin)
        what = " (the top-level tensors)";
    else if (!p.top || !all_layers)
        what = fmt::format(" (layer{} {}{}{})", last > p.layer_begin ? "s" : "", p.layer_begin,
                           last > p.layer_begin ? fmt::format(" to {}", last) : "",
                           p.top ? " and the top-level tensors" : "");
    const std::string who = ranks.size() == 1 ? fmt::format("rank {}", ranks[0])
                            : static_cast<int>(ranks.size()) == cp_size
                                ? fmt::format("all {} ranks", cp_size)
                                : fmt::format("{} ranks", ranks.size());
    const bool whole = what.empty();
    const std::string advice =
        whole ? "the CPU backend holds the whole model in fp32: use a machine with more memory, or "
                "--device cuda, which loads one layer at a time"
        : ranks.size() > 1
            ? "run one process per GPU under mpirun: each reads only its own rank's experts"
            : "use a machine with more memory";
    CPFILL_FAIL(
        "out of host memory: the fp32 weights{} of {} of --cp {} need {:.2f} GB ({:.2f} GB dense "
        "tensors, held once, and {:.2f} GB of expert slices) but {:.2f} GB are available ({}); {}",
        what, who, cp_size, gb(need), gb(dense), gb(need - dense), gb(have->available),
        have->source, advice);
}

}  // namespace

size_t rank_weights_host_bytes(const ModelConfig& cfg, int cp_size, const std::vector<int>& ranks,
                               const LoadPart& part) {
    size_t dense = 0, expert = 0;  // expert: bytes of all experts at full width
    for (const WeightSpec& spec : weight_specs(cfg)) {
        if (spec.layer < 0 ? !part.top : !part.has_layer(spec.layer)) continue;
        const size_t numel = static_cast<size_t>(shape_numel(spec.shape));
        if (is_expert_weight(spec))
            expert += numel * 4;
        else
            dense += numel * (spec.cls == WeightClass::I64 ? 8 : 4);
    }
    // Rank r holds hidden units [moe_dim·r/C, moe_dim·(r+1)/C) of every expert; each expert tensor
    // is moe_dim × d_model, so its slice is exactly width_r / moe_dim of it.
    size_t sliced = 0;
    for (int r : ranks)
        sliced += expert / static_cast<size_t>(cfg.moe_dim) *
                  static_cast<size_t>(slice_width(cfg.moe_dim, {r, cp_size}));
    return dense + sliced;
}

size_t streamed_load_host_bytes(const ModelConfig& cfg, int cp_size,
                                const std::vector<int>& ranks) {
    size_t most = rank_weights_host_bytes(cfg, cp_size, ranks, LoadPart{true, 0, 0});
    for (int i = 0; i < cfg.n_layers; ++i)
        most =
            std::max(most, rank_weights_host_bytes(cfg, cp_size, ranks, LoadPart{false, i, i + 1}));
    return most;
}

size_t rank_weights_stored_bytes(const Checkpoint& ck, int cp_size, const std::vector<int>& ranks) {
    const ModelConfig& cfg = ck.config();
    int64_t units = 0;  // expert hidden units the ranks hold
    for (int r : ranks) units += slice_width(cfg.moe_dim, {r, cp_size});
    double total = 0;
    for (const WeightSpec& spec : ck.specs().all()) {
        const double bytes = static_cast<double>(ck.stored(spec.name).bytes);
        total += is_expert_weight(spec) ? bytes * double(units) / double(cfg.moe_dim) : bytes;
    }
    return static_cast<size_t>(total);
}

std::vector<ModelWeights> load_rank_weights(const Checkpoint& ck, int cp_size,
                                            const LoadOptions& opt, LoadStats* stats,
                                            const std::vector<int>& only_ranks) {
    const auto t0 = std::chrono::steady_clock::now();
    const ModelConfig& cfg = ck.config();
    CPFILL_CHECK(cp_size >= 1 && cfg.moe_dim >= cp_size,
                 "cannot split moe_intermediate_size {} over {} ranks (expected 1 to {})",
                 cfg.moe_dim, cp_size, cfg.moe_dim);
    CPFILL_CHECK(opt.threads >= 0, "load threads {}: expected >= 0 (0: all hardware threads)",
                 opt.threads);
    const std::vector<int> which = ranks_or_all(only_ranks, cp_size);
    for (int r : which)
        CPFILL_CHECK(r >= 0 && r < cp_size, "load: rank {} outside a CP group of {}", r, cp_size);
    check_host_memory(cfg, cp_size, which, opt);
    const LoadPart& part = opt.part;
    LoadPlan plan(ck);
    ModelWeights dense;
    dense.cfg = cfg;
    dense.layers.resize(cfg.n_layers);
    for (int i = 0; i < cfg.n_layers; ++i)
        if (part.has_layer(i)) init_layer(dense.layers[i], cfg, i);
    plan_dense(plan, ck, part, dense);
    std::vector<ModelWeights> ranks(which.size(), dense);  // dense tensors shared, not copied
    for (size_t k = 0; k < which.size(); ++k) ranks[k].slice = {which[k], cp_size};
    plan_experts(plan, ck, part, ranks);

    const size_t stored =
        plan.run(opt.threads > 0 ? opt.threads : default_thread_count(), opt.progress, opt.bar);
    // tid2eid was written into `dense`'s layers: hand it to the ranks.
    for (int i = 0; i < cfg.n_layers; ++i)
        for (ModelWeights& w : ranks) w.layers[i].moe.tid2eid = dense.layers[i].moe.tid2eid;
    if (stats) {
        stats->stored_bytes = stored;
        stats->f32_bytes = plan.f32_bytes();
        stats->seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return ranks;
}

LoadStats load_rank_weights_in_parts(
    const Checkpoint& ck, int cp_size, LoadOptions opt, const std::vector<int>& only_ranks,
    const std::function<void(int part, const std::vector<ModelWeights>& ranks)>& on_part) {
    const auto t0 = std::chrono::steady_clock::now();
    Progress bar("loading",
                 rank_weights_stored_bytes(ck, cp_size, ranks_or_all(only_ranks, cp_size)),
                 opt.progress);
    opt.bar = &bar;
    LoadStats total, stats;
    for (int part = -1; part < ck.config().n_layers; ++part) {
        opt.part = part < 0 ? LoadPart{true, 0, 0} : LoadPart{false, part, part + 1};
        const std::vector<ModelWeights> ranks =
            load_rank_weights(ck, cp_size, opt, &stats, only_ranks);
        total.stored_bytes += stats.stored_bytes;
        total.f32_bytes += stats.f32_bytes;
        on_part(part, ranks);
    }
    bar.finish();
    total.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return total;
}

size_t ModelWeights::bytes() const {
    size_t n = 0;
    auto& self = const_cast<ModelWeights&>(*this);  // tensor_slot only looks
    for (const WeightSpec& spec : weight_specs(cfg)) {
        if (spec.slot == WeightSlot::W3) continue;
        if (spec.layer >= static_cast<int>(layers.size())) continue;
        const Tensor* t = tensor_slot(self, spec);  // W1: [w1; w3] together
        if (t && t->defined()) n += t->nbytes();
    }
    return n;
}

}  // namespace cpfill
