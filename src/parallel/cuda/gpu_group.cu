// GpuGroup: NCCL bootstrap (threaded or one rank per process), weights, the memory check and the
// rank threads of a run; plan_gpu_memory and the measured ceilings.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/progress.h"
#include "model/cuda/gpu_weights.h"
#include "model/cuda/stored_reader.h"
#include "model/weight_bytes.h"
#include "ops/cuda/gemm.h"
#include "parallel/cuda/gpu_runner.h"
#include "parallel/cuda/gpu_workspace.h"
#include "parallel/gpu_prefill.h"
#include "runtime/cuda/ce_comm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/nccl_comm.h"
#include "runtime/cuda/sm90.h"
#include "runtime/device.h"

namespace cpfill {

using cuda::RankDevice;

struct GpuGroup::Impl {
    GpuGroupOptions opt;
    std::vector<std::unique_ptr<RankDevice>> ranks;  // local ranks
    std::vector<int> local;                          // their ranks
    bool broken = false;     // a failure aborted the communicators: the group cannot run again
    bool abandoned = false;  // a rank thread was left running: this Impl must outlive it
    std::string broken_why;

    // Runs fn(i) for each local rank on its own thread with its device current; rethrows the
    // first error after aborting every local communicator (peers in other processes see theirs
    // fail or time out). A watchdog: once a rank has failed, the others get kStopGrace to notice
    // the flag at their next host wait. A rank still running then is blocked behind its device:
    // an NCCL kernel waits there for the dead peer, and the rank's host thread waits for the
    // device (a first launch of a kernel that CUDA loads lazily waits for the whole device). So
    // the communicators are aborted at once, which ends those kernels. A rank that has not
    // returned kAbortGrace after that is left behind (detached) and the error says so: the
    // group never waits forever.
    template <class F>
    void on_ranks(F fn) {
        struct Shared {
            std::mutex mu;
            std::condition_variable cv;
            size_t done = 0;
            std::vector<char> finished;
            std::exception_ptr first;
            cuda::AbortFlag flag;
        };
        auto sh = std::make_shared<Shared>();
        sh->finished.assign(ranks.size(), 0);
        std::vector<std::thread> threads;
        for (size_t i = 0; i < ranks.size(); ++i)
            threads.emplace_back([&fn, sh, i, this] {
                try {
                    CPFILL_CUDA_CHECK(cudaSetDevice(ranks[i]->device));
                    fn(i, sh->flag);
                } catch (const std::exception& e) {
                    sh->flag.raise(fmt::format("rank {} failed: {}", ranks[i]->rank, e.what()));
                    std::lock_guard<std::mutex> lock(sh->mu);
                    if (!sh->first) sh->first = std::current_exception();
                }
                std::lock_guard<std::mutex> lock(sh->mu);
                ++sh->done;
                sh->finished[i] = 1;
                sh->cv.notify_all();
            });
        std::unique_lock<std::mutex> lock(sh->mu);
        const auto all_done = [&] { return sh->done == threads.size(); };
        sh->cv.wait(lock, [&] { return all_done() || sh->first != nullptr; });
        bool aborted = false;
        if (!all_done() && !sh->cv.wait_for(lock, kStopGrace, all_done)) {
            lock.unlock();
            abort_all();
            aborted = true;
            lock.lock();
            sh->cv.wait_for(lock, kAbortGrace, all_done);
        }
        std::string left_behind;
        for (size_t i = 0; i < threads.size(); ++i) {
            if (sh->finished[i]) continue;
            threads[i].detach();  // it holds `sh` and this group's ranks, which stay allocated
            left_behind += fmt::format(" {}", ranks[i]->rank);
        }
        lock.unlock();
        for (auto& t : threads)
            if (t.joinable()) t.join();
        if (!sh->first) return;
        if (!aborted) abort_all();
        broken = true;
        broken_why = sh->flag.why();
        if (left_behind.empty()) std::rethrow_exception(sh->first);
        abandoned = true;
        CPFILL_FAIL(
            "{}; rank(s){} did not stop within {} s after their communicators were "
            "aborted and were left running",
            broken_why, left_behind,
            std::chrono::duration_cast<std::chrono::seconds>(kAbortGrace).count());
    }

    // Aborts every local communicator at once, one thread each: an abort may wait for kernels of
    // another communicator on the same device, which end only when that one is aborted too.
    // Waits up to kAbortGrace; aborts still running then are left to finish (the group is broken
    // and keeps its communicators allocated).
    void abort_all() {
        struct Pending {
            std::mutex mu;
            std::condition_variable cv;
            size_t left = 0;
        };
        auto p = std::make_shared<Pending>();
        std::vector<cuda::DeviceComm*> comms;
        for (auto& r : ranks)
            for (cuda::DeviceComm* c : {r->cp_comm.get(), r->overlap.get()})
                if (c) comms.push_back(c);
        p->left = comms.size();
        for (cuda::DeviceComm* c : comms)
            std::thread([p, c] {
                c->abort();
                std::lock_guard<std::mutex> lock(p->mu);
                --p->left;
                p->cv.notify_all();
            }).detach();
        std::unique_lock<std::mutex> lock(p->mu);
        p->cv.wait_for(lock, kAbortGrace, [&] { return p->left == 0; });
    }

    static constexpr std::chrono::milliseconds kStopGrace{2000}, kAbortGrace{30000};
};

NcclId GpuGroup::new_nccl_id() {
    ncclUniqueId id;
    CPFILL_NCCL_CHECK(ncclGetUniqueId(&id));
    NcclId out;
    static_assert(sizeof(id) == sizeof(out));
    std::memcpy(out.data(), &id, sizeof(id));
    return out;
}

namespace {

// --indexer on a rank's new weights (GpuGroupOptions::indexer), on that rank's device.
void apply_indexer(cuda::GpuWeights& w, GpuIndexer choice) {
    w.indexer_fp8 = gpu_indexer_fp8(choice, w.format, cuda::current_device_is_sm90());
}

}  // namespace

GpuGroup::GpuGroup(const GpuGroupOptions& opt) : impl_(std::make_unique<Impl>()) {
    Impl& g = *impl_;
    g.opt = opt;
    const int C = opt.cp;
    CPFILL_CHECK(C >= 1 && C <= 64, "--cp {}: expected 1 to 64 GPU ranks", C);
    std::vector<int> local = opt.local_ranks;
    const bool threaded = local.empty();
    if (threaded)
        for (int r = 0; r < C; ++r) local.push_back(r);
    std::string why;
    const int n_dev = cuda_device_count(&why);
    CPFILL_CHECK(n_dev > 0, "--device cuda: no usable GPU: {}", why);
    const bool ce = opt.collectives == GpuCollectives::Ce;
    CPFILL_CHECK(!ce || threaded,
                 "--collectives ce needs every rank in one process; under mpirun use "
                 "--collectives nccl");
    if (threaded)
        CPFILL_CHECK(C <= n_dev,
                     "--cp {} needs {} GPUs in this process but {} are visible (run under mpirun "
                     "for more machines, or lower --cp)",
                     C, C, n_dev);
    NcclId id = threaded && !ce ? new_nccl_id() : opt.nccl_id;
    ncclUniqueId nid;
    std::memcpy(&nid, id.data(), sizeof(nid));
    for (size_t i = 0; i < local.size(); ++i) {
        auto r = std::make_unique<RankDevice>();
        r->rank = local[i];
        r->cp = C;
        r->device = i < opt.devices.size() ? opt.devices[i] : static_cast<int>(i);
        CPFILL_CHECK(r->rank >= 0 && r->rank < C, "rank {} outside a group of {}", r->rank, C);
        CPFILL_CHECK(r->device >= 0 && r->device < n_dev,
                     "rank {}: GPU {} does not exist ({} visible)", r->rank, r->device, n_dev);
        // --indexer fp8 on a GPU without the kernel: refused up front.
        (void)gpu_indexer_fp8(opt.indexer, opt.weights, cuda::device_is_sm90(r->device));
        g.ranks.push_back(std::move(r));
    }
    g.local = local;
    const std::shared_ptr<cuda::CeGroup> ce_group = ce ? cuda::make_ce_group(C) : nullptr;
    // NCCL init is collective: every local rank joins at once, on its own thread.
    try {
        g.on_ranks([&](size_t i, const cuda::AbortFlag&) {
            RankDevice& r = *g.ranks[i];
            // One plan cache for the rank's GEMM contexts (the expert streams' too).
            r.gemm = std::make_unique<ops::cuda::GemmContext>();
            r.gemm_route = std::make_unique<ops::cuda::GemmContext>(*r.gemm);
            r.init_streams();
            if (ce)
                r.cp_comm = std::make_unique<cuda::CeComm>(ce_group, r.rank);
            else
                r.cp_comm = std::make_unique<cuda::NcclComm>(r.rank, C, nid);
            r.copy_engines = ce;
            r.overlap = r.cp_comm->dup();
        });
    } catch (...) {
        if (g.abandoned) (void)impl_.release();  // a rank thread still uses it
        throw;
    }
}

GpuGroup::~GpuGroup() {
    // After a failure, kernels of aborted collectives may still sit on the devices, and freeing
    // device memory (cudaFree synchronises) could wait for them: leave the device state to the
    // process's exit instead.
    if (!impl_->broken) return;
    if (impl_->abandoned) {  // a rank thread left running still uses the group's state
        (void)impl_.release();
        return;
    }
    for (auto& r : impl_->ranks) (void)r.release();
}

int GpuGroup::cp() const { return impl_->opt.cp; }

const std::vector<int>& GpuGroup::local_ranks() const { return impl_->local; }

namespace {

// The smallest CP size whose expert slice lets a rank's weights (+ `reserve`) fit into `capacity`
// bytes, or 0 when none up to 64 does.
int weights_fitting_cp(const ModelConfig& cfg, GpuWeightFormat format, size_t capacity,
                       size_t reserve) {
    for (int c = 1; c <= std::min(64, cfg.moe_dim); ++c)
        if (gpu_weight_bytes(cfg, c, format) + reserve <= capacity) return c;
    return 0;
}

// Local rank i's host view, checked against the group and the rank.
const ModelWeights& rank_view(const GpuGroup::Impl& g, size_t i,
                              const std::vector<const ModelWeights*>& rank_weights) {
    CPFILL_CHECK(rank_weights.size() == g.ranks.size(), "weights for {} ranks, {} local ranks",
                 rank_weights.size(), g.ranks.size());
    const RankDevice& r = *g.ranks[i];
    const ModelWeights& w = *rank_weights[i];
    CPFILL_CHECK(w.slice.part == r.rank && w.slice.parts == r.cp,
                 "rank {} of {} got expert slice {} of {}", r.rank, r.cp, w.slice.part,
                 w.slice.parts);
    return w;
}

// All of the model's weights must fit rank r's GPU, checked before anything is read (with the
// 512 MiB that run() keeps for cuBLAS, NCCL and CUB).
void check_weights_fit(const RankDevice& r, const ModelConfig& cfg, GpuWeightFormat format) {
    const size_t reserve = size_t{512} << 20;
    const size_t need = gpu_rank_weight_bytes(cfg, {r.rank, r.cp}, format);
    size_t free_b = 0, total_b = 0;
    CPFILL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (need + reserve <= free_b) return;
    const int fit = weights_fitting_cp(cfg, format, free_b, reserve);
    CPFILL_FAIL(
        "out of GPU memory: the {} weights of rank {} of --cp {} need {:.2f} GB (+0.5 GB "
        "reserve) but GPU {} has {:.2f} GB free; {}",
        gpu_weight_format_name(format), r.rank, r.cp, need * 1e-9, r.device, free_b * 1e-9,
        fit > r.cp ? fmt::format("--cp {} would fit the weights", fit)
                   : std::string("no --cp up to 64 fits the weights"));
}

}  // namespace

GpuGroup::StoredLoad GpuGroup::load_stored(const Checkpoint& ck, int threads, bool progress) {
    const auto t0 = std::chrono::steady_clock::now();
    Impl& g = *impl_;
    const ModelConfig& cfg = ck.config();
    std::vector<ExpertSlice> slices;
    for (const auto& r : g.ranks) slices.push_back({r->rank, r->cp});
    // Pieces of up to 16 MiB in 2 · readers + 2 slots: the readers stay a few pieces ahead of
    // every GPU. Four readers per GPU (at most `threads`): on the H200 machine 4 uploaded 4.4 GB
    // in 0.36 s and 16 in 0.53 s, their copies competing with the GPU's for host memory
    // (docs/loading.md).
    threads = std::clamp(threads, 1, 4 * static_cast<int>(slices.size()));
    cuda::StoredPlan plan = cuda::stored_upload_plan(ck, slices, size_t{16} << 20);
    Progress bar("loading", plan.stored_bytes, progress);
    cuda::StoredReader rd(ck, std::move(plan), threads, 2 * threads + 2, &bar,
                          g.ranks.front()->device);
    g.on_ranks([&](size_t i, const cuda::AbortFlag& abort) {
        RankDevice& r = *g.ranks[i];
        r.weights.reset();
        r.arena.reset();
        try {
            check_weights_fit(r, cfg, g.opt.weights);
            auto w = std::make_unique<cuda::GpuWeights>(
                cuda::upload_stored_top(ck, {r.rank, r.cp}, g.opt.weights, rd));
            for (int li = 0; li < cfg.n_layers; ++li) {
                CPFILL_CHECK(!abort.raised(), "stopped: {}", abort.why());
                cuda::upload_stored_layer(*w, li, ck, rd);
            }
            apply_indexer(*w, g.opt.indexer);
            r.weights = std::move(w);
        } catch (...) {
            rd.abort();  // the readers stop; the other ranks read what they still need at once
            throw;
        }
        r.alloc_host_counts(cfg.n_experts);
    });
    StoredLoad s;
    s.bytes = rd.bytes_read();
    s.misses = rd.misses();
    s.reader_wait_s = rd.reader_wait_seconds();
    s.upload_wait_s = rd.upload_wait_seconds();
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

void GpuGroup::load_top(const std::vector<const ModelWeights*>& rank_weights) {
    Impl& g = *impl_;
    g.on_ranks([&](size_t i, const cuda::AbortFlag&) {
        RankDevice& r = *g.ranks[i];
        const ModelWeights& w = rank_view(g, i, rank_weights);
        r.weights.reset();
        r.arena.reset();
        check_weights_fit(r, w.cfg, g.opt.weights);
        r.weights = std::make_unique<cuda::GpuWeights>(cuda::upload_top(w, g.opt.weights));
        apply_indexer(*r.weights, g.opt.indexer);
        r.alloc_host_counts(w.cfg.n_experts);
    });
}

void GpuGroup::load_layer(int layer, const std::vector<const ModelWeights*>& rank_weights) {
    Impl& g = *impl_;
    g.on_ranks([&](size_t i, const cuda::AbortFlag&) {
        RankDevice& r = *g.ranks[i];
        const ModelWeights& w = rank_view(g, i, rank_weights);
        CPFILL_CHECK(r.weights != nullptr, "rank {}: load_layer({}) before load_top", r.rank,
                     layer);
        CPFILL_CHECK(layer >= 0 && layer < static_cast<int>(w.layers.size()),
                     "rank {}: layer {} of a model with {} layers", r.rank, layer, w.layers.size());
        cuda::upload_layer(*r.weights, layer, w.layers[layer]);
    });
}

int64_t GpuGroup::prepare_expert_plans(int64_t max_rows) {
    Impl& g = *impl_;
    std::vector<int64_t> made(g.ranks.size(), 0);
    g.on_ranks([&](size_t i, const cuda::AbortFlag&) {
        RankDevice& r = *g.ranks[i];
        CPFILL_CHECK(r.weights != nullptr, "rank {}: expert plans before the weights", r.rank);
        cuda::GpuCtx c;
        c.stream = r.compute;
        c.gemm = r.gemm.get();
        // One layer per kind of expert weights: the plans depend on the storage, not the values.
        std::vector<std::pair<GpuStorage, GpuStorage>> seen;
        for (const auto& L : r.weights->layers) {
            const std::pair<GpuStorage, GpuStorage> k{L.w13.storage, L.w2.storage};
            if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
            seen.push_back(k);
            made[i] += cuda::gpu_moe_plan_experts(c, *r.weights, L, max_rows);
        }
    });
    return made[0];
}

GpuGroup::WeightStats GpuGroup::weight_stats() const {
    WeightStats s;
    for (const auto& r : impl_->ranks) {
        if (!r->weights) continue;
        s.bytes = std::max(s.bytes, r->weights->bytes);
        s.fp8_values += r->weights->fp8_values;
        s.fp8_inexact += r->weights->fp8_inexact;
        s.indexer_fp8 = r->weights->indexer_fp8;
    }
    return s;
}

void GpuGroup::load(const std::vector<const ModelWeights*>& rank_weights) {
    load_top(rank_weights);
    for (int li = 0; li < rank_weights[0]->cfg.n_layers; ++li) load_layer(li, rank_weights);
}

void GpuGroup::randomize(const ModelConfig& cfg, uint64_t seed) {
    Impl& g = *impl_;
    g.on_ranks([&](size_t i, const cuda::AbortFlag&) {
        RankDevice& r = *g.ranks[i];
        r.weights.reset();
        r.arena.reset();
        r.weights = std::make_unique<cuda::GpuWeights>(
            cuda::random_weights(cfg, ExpertSlice{r.rank, r.cp}, seed, g.opt.weights));
        apply_indexer(*r.weights, g.opt.indexer);
        r.alloc_host_counts(cfg.n_experts);
    });
}

namespace {

// The smallest CP size ≥ 1 at which weights + workspace fit into `capacity` bytes per GPU, in
// chunks of `chunk` tokens (0: one pass), with the group's collectives (copy_engines: their
// staging counted).
int fitting_cp(const ModelConfig& cfg, GpuWeightFormat format, GpuIndexer indexer,
               const std::vector<std::vector<int32_t>>& requests, const GpuRunOptions& opt,
               int64_t chunk, size_t capacity, bool copy_engines) {
    for (int c = 1; c <= 64; ++c) {
        if (cfg.moe_dim < c) break;
        const RunPlan p = make_run_plan(requests, cfg, c, opt.tbo, chunk, gpu_tbo_rule);
        const ExpertSlice widest = widest_slice(cfg.moe_dim, c);
        const int64_t width = slice_width(cfg.moe_dim, widest);
        const cuda::WeightNeeds needs = cuda::needs_of(cfg, widest, format, indexer);
        if (cuda::workspace_bytes(cfg, p, c, width, opt, needs, copy_engines) +
                gpu_rank_weight_bytes(cfg, widest, format) <=
            capacity)
            return c;
    }
    return 0;
}

// Bytes a rank's GPU can give this group: free memory plus what its arena and weights hold
// (weights + GpuRunOptions::workspace_limit at most).
size_t memory_capacity(GpuGroup::Impl& g, const GpuRunOptions& opt) {
    size_t cap = SIZE_MAX;
    for (auto& r : g.ranks) {
        size_t free_b = 0, total_b = 0;
        CPFILL_CUDA_CHECK(cudaSetDevice(r->device));
        CPFILL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        size_t have = free_b + (r->arena ? r->arena->capacity() : 0);
        if (opt.workspace_limit > 0) have = std::min(have, opt.workspace_limit);
        cap = std::min(cap, have + r->weights->bytes);
    }
    return cap;
}

// Empty when the plan's workspace fits on every local GPU (with 512 MiB kept for cuBLAS, NCCL
// and CUB), else what is missing, in words.
std::string memory_shortfall(GpuGroup::Impl& g, const ModelConfig& cfg, const RunPlan& plan,
                             const GpuRunOptions& opt) {
    for (auto& r : g.ranks) {
        // (The runner's width: the widest slice's with copy-engine collectives.)
        const int64_t width = r->copy_engines
                                  ? slice_width(cfg.moe_dim, widest_slice(cfg.moe_dim, g.opt.cp))
                                  : r->weights->width;
        const size_t need = cuda::workspace_bytes(cfg, plan, g.opt.cp, width, opt,
                                                  cuda::needs_of(*r->weights), r->copy_engines);
        size_t free_b = 0, total_b = 0;
        CPFILL_CUDA_CHECK(cudaSetDevice(r->device));
        CPFILL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        size_t have = free_b + (r->arena ? r->arena->capacity() : 0);
        if (opt.workspace_limit > 0)
            have = std::min(have, opt.workspace_limit + (size_t{512} << 20));
        if (need + (size_t{512} << 20) > have)
            return fmt::format(
                "{:.2f} GB of workspace per GPU needed (+0.5 GB reserve) but GPU {} has {:.2f} GB "
                "free beside {:.2f} GB of weights",
                need * 1e-9, r->device, have * 1e-9, r->weights->bytes * 1e-9);
    }
    return {};
}

}  // namespace

PrefillOutput GpuGroup::run(const std::vector<std::vector<int32_t>>& requests,
                            const GpuRunOptions& opt, GpuStats* stats) {
    Impl& g = *impl_;
    CPFILL_CHECK(!g.broken,
                 "this GPU group was stopped by an earlier failure ({}); start a new one",
                 g.broken_why);
    for (auto& r : g.ranks)
        CPFILL_CHECK(r->weights != nullptr, "rank {} has no weights (load or randomize first)",
                     r->rank);
    const ModelConfig& cfg = g.ranks[0]->weights->cfg;
    const int C = g.opt.cp;
    // Memory check before any work: the workspace must fit beside the weights. With `auto`, a
    // batch that does not fit whole may still fit split in two (each sub-batch's MoE buffers are
    // half as large): then TBO is used whatever the cost model says. Without --chunk, a batch that
    // still does not fit runs in the largest power-of-two chunks that do (the KV store of the
    // whole prompt stays; only the activations shrink).
    // Under mpirun each process sees only its own GPUs, so a plan chosen by free memory could
    // differ between processes: there the plan is the one asked for, and the error names the
    // --chunk that would fit.
    const bool one_process = g.ranks.size() == static_cast<size_t>(C);
    RunPlan plan = make_run_plan(requests, cfg, C, opt.tbo, opt.chunk, gpu_tbo_rule);  // validates
    std::string short_of = memory_shortfall(g, cfg, plan, opt);
    int64_t fitting_chunk = 0;
    if (!short_of.empty() && one_process && opt.tbo == TboMode::Auto && !plan.tbo()) {
        RunPlan split = make_run_plan(requests, cfg, C, TboMode::On, opt.chunk, gpu_tbo_rule);
        if (split.tbo() && memory_shortfall(g, cfg, split, opt).empty()) {
            plan = std::move(split);
            short_of.clear();
        }
    }
    int64_t total = 0;
    for (const auto& r : requests) total += static_cast<int64_t>(r.size());
    if (!short_of.empty()) {
        int64_t chunk = kMinAutoChunk;
        while (chunk * 2 < std::min(total, opt.chunk > 0 ? opt.chunk : total)) chunk *= 2;
        for (; chunk >= kMinAutoChunk; chunk /= 2) {
            RunPlan chunked = make_run_plan(requests, cfg, C, opt.tbo, chunk, gpu_tbo_rule);
            if (memory_shortfall(g, cfg, chunked, opt).empty()) {
                fitting_chunk = chunk;
                if (opt.chunk == 0 && one_process) {
                    plan = std::move(chunked);
                    short_of.clear();
                }
                break;
            }
        }
    }
    if (!short_of.empty() && fitting_chunk > 0)
        CPFILL_FAIL("out of GPU memory: {} tokens at --cp {}{}: {}; --chunk {} would fit", total, C,
                    opt.chunk > 0 ? fmt::format(" --chunk {}", opt.chunk) : std::string(), short_of,
                    fitting_chunk);
    if (!short_of.empty()) {
        const int64_t advice_chunk = opt.chunk > 0 ? opt.chunk : kMinAutoChunk;
        const int fit =
            fitting_cp(cfg, g.opt.weights, g.opt.indexer, requests, opt, advice_chunk,
                       memory_capacity(g, opt), g.opt.collectives == GpuCollectives::Ce);
        CPFILL_FAIL("out of GPU memory: {} tokens at --cp {}{}: {}; {}", total, C,
                    opt.chunk > 0 ? fmt::format(" --chunk {}", opt.chunk)
                                  : fmt::format(" (also in chunks of {})", kMinAutoChunk),
                    short_of,
                    fit > C ? fmt::format("--cp {} would fit", fit)
                            : std::string("no --cp up to 64 fits: shorten the prompt"));
    }
    // Rank 0's process collects logits and records; the others return counts only.
    const bool has_rank0 = g.ranks[0]->rank == 0;
    const std::vector<std::vector<int32_t>> none;
    PrefillOutput out =
        make_prefill_output(cfg, has_rank0 ? requests : none, opt.all_logits,
                            opt.record_hidden && has_rank0, opt.record_topk && has_rank0);
    out.n_tokens = plan.n_tokens;
    out.tbo_used = plan.tbo();
    out.chunk = plan.chunk;
    if (opt.record_kv && has_rank0)
        out.kv.assign(requests.size(), std::vector<LayerKv>(cfg.n_layers));
    GpuStats st;
    const ops::cuda::GemmPlanStats plans0 = ops::cuda::gemm_plan_stats();
    const auto t0 = std::chrono::steady_clock::now();
    g.on_ranks([&](size_t i, const cuda::AbortFlag& flag) {
        RankDevice& r = *g.ranks[i];
        const bool zero = r.rank == 0;
        cuda::run_rank(r, plan, opt, flag, g.opt.deadline, zero ? &out : nullptr,
                       zero ? &st : nullptr);
    });
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ops::cuda::GemmPlanStats plans1 = ops::cuda::gemm_plan_stats();
    st.gemm_plans = plans1.made - plans0.made;
    st.gemm_plan_seconds = plans1.seconds - plans0.seconds;
    st.tbo_used = plan.tbo();
    st.chunk = plan.chunk;
    const bool grouped_ok = cuda::grouped_experts(opt.expert_gemm);
    const cuda::GpuWeights& w0 = *g.ranks[0]->weights;
    for (const auto& L : w0.layers) {
        st.grouped_fp8_layers += cuda::experts_grouped_fp8(L, grouped_ok);
        st.grouped_bf16_layers += cuda::experts_grouped_bf16(w0, L, grouped_ok);
    }
    st.n_tokens = plan.n_tokens;
    for (auto& r : g.ranks) {
        size_t free_b = 0, total_b = 0;
        CPFILL_CUDA_CHECK(cudaSetDevice(r->device));
        CPFILL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        st.peak_bytes = std::max(st.peak_bytes, total_b - free_b);
        st.weight_bytes = std::max(st.weight_bytes, r->weights->bytes);
    }
    if (stats) *stats = st;
    return out;
}

GpuMemoryPlan plan_gpu_memory(const ModelConfig& cfg, int64_t n_tokens, int n_requests, int cp,
                              bool tbo, bool all_logits, GpuWeightFormat format, int64_t chunk,
                              GpuIndexer indexer, ResidualDtype residual) {
    CPFILL_CHECK(n_requests >= 1 && n_tokens >= n_requests, "plan: {} tokens in {} requests",
                 n_tokens, n_requests);
    std::vector<std::vector<int32_t>> reqs(n_requests);
    for (int i = 0; i < n_requests; ++i)
        reqs[i].assign(n_tokens / n_requests + (i < n_tokens % n_requests ? 1 : 0), 0);
    GpuRunOptions opt;
    opt.tbo = tbo ? TboMode::On : TboMode::Off;
    opt.all_logits = all_logits;
    opt.residual = residual;
    const RunPlan plan = make_run_plan(reqs, cfg, cp, opt.tbo, chunk, gpu_tbo_rule);
    const ExpertSlice widest = widest_slice(cfg.moe_dim, cp);
    const int64_t width = slice_width(cfg.moe_dim, widest);
    GpuMemoryPlan p;
    p.weights = gpu_rank_weight_bytes(cfg, widest, format);
    p.workspace = cuda::workspace_bytes(cfg, plan, cp, width, opt,
                                        cuda::needs_of(cfg, widest, format, indexer));
    return p;
}

}  // namespace cpfill
