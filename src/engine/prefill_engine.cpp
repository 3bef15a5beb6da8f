// PrefillEngine: checkpoint → every rank's fp32 weights (parallel load); runs with timing.
#include "engine/prefill_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "core/host_memory.h"
#include "core/parallel.h"
#include "io/checkpoint.h"
#include "model/batch.h"
#include "ops/gemm_plan_rows.h"

namespace cpfill {

namespace {
// Argmax of each request's last-position logits ([vocab] or [len, vocab]).
std::vector<int32_t> last_argmax(const std::vector<Tensor>& logits, int64_t V) {
    std::vector<int32_t> out;
    for (const Tensor& l : logits)
        out.push_back(argmax(l.f32() + (l.ndim() == 2 ? (l.dim(0) - 1) * V : 0), V));
    return out;
}

// Refuses a CPU-backend prefill whose buffers (cpu_prefill_bytes) exceed the host memory left,
// naming a --chunk that would fit when there is one.
void check_cpu_memory(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& requests,
                      const PrefillOptions& p) {
    const std::optional<HostMemory> have = host_memory_available();
    if (!have) return;
    // The estimate came out 6-10% below the measured growth of peak RSS (docs/status.md): 15% more.
    const auto with_margin = [&](const PrefillOptions& o) {
        return static_cast<size_t>(1.15 * static_cast<double>(cpu_prefill_bytes(cfg, requests, o)));
    };
    const size_t need = with_margin(p);
    if (need <= have->available) return;
    int64_t total = 0;
    for (const auto& r : requests) total += static_cast<int64_t>(r.size());
    std::string advice = "shorten the prompt or use --device cuda";
    const int64_t start = p.chunk > 0 ? p.chunk : total;
    for (int64_t chunk = int64_t{1} << 30; chunk >= 256; chunk /= 2) {
        if (chunk >= start) continue;
        PrefillOptions c = p;
        c.chunk = chunk;
        if (with_margin(c) <= have->available) {
            advice = fmt::format("--chunk {} would fit (the KV store still grows with the prompt)",
                                 chunk);
            break;
        }
    }
    CPFILL_FAIL(
        "out of host memory: a CPU-backend prefill of {} tokens at --cp {}{} needs about {:.2f} GB "
        "beside the weights (activations, collective buffers, KV store) but {:.2f} GB are "
        "available ({}); {}",
        total, p.cp, p.chunk > 0 ? fmt::format(" --chunk {}", p.chunk) : std::string(), need * 1e-9,
        have->available * 1e-9, have->source, advice);
}

// The CUDA backend downloads rank 0's logits into host tensors (f32 [vocab] per request, or
// [len, vocab] with --all-logits: 68 GB at 128k tokens); check_cpu_memory counts them for the CPU
// backend, this for the GPUs.
void check_gpu_host_logits(const ModelConfig& cfg,
                           const std::vector<std::vector<int32_t>>& requests, bool all_logits) {
    const std::optional<HostMemory> have = host_memory_available();
    if (!have) return;
    size_t rows = 0;
    for (const auto& r : requests) rows += all_logits ? r.size() : 1;
    const size_t need = rows * static_cast<size_t>(cfg.vocab_size) * sizeof(float);
    CPFILL_CHECK(need <= have->available,
                 "out of host memory: the logits of {} requests ({} rows of vocab {}, f32) need "
                 "{} bytes ({:.2f} GB) on the host but {} bytes ({:.2f} GB) are available ({}); "
                 "{}",
                 requests.size(), rows, cfg.vocab_size, need, need * 1e-9, have->available,
                 have->available * 1e-9, have->source,
                 all_logits ? "leave out --all-logits (the last position's only) or shorten the "
                              "prompt"
                            : "run fewer requests at once");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

PrefillEngine::PrefillEngine(const std::string& model_dir, const EngineOptions& options)
    : options_(options) {
    auto t0 = std::chrono::steady_clock::now();
    CPFILL_CHECK(options.cp >= 1 && options.cp <= 64, "--cp {}: expected 1 to 64 CPU ranks",
                 options.cp);
    Checkpoint ckpt(model_dir);
    const ModelConfig& cfg = ckpt.config();
    CPFILL_CHECK(cfg.moe_dim >= options.cp,
                 "--cp {}: the experts' width moe_intermediate_size {} cannot be split over more "
                 "ranks than it has units (expected --cp <= {})",
                 options.cp, cfg.moe_dim, cfg.moe_dim);
    cfg_ = cfg;
    CPFILL_CHECK(options.cuda || options.weights == "auto",
                 "--weights {}: the CPU backend computes in fp32 from the dequantised weights; "
                 "--weights applies to --device cuda (leave it out, or auto)",
                 options.weights);
    CPFILL_CHECK(options.cuda || options.gpu.indexer == GpuIndexer::Auto,
                 "--indexer {}: the CPU backend scores the indexer in fp32; --indexer applies to "
                 "--device cuda (leave it out, or auto)",
                 gpu_indexer_name(options.gpu.indexer));
    CPFILL_CHECK(options.cuda || options.gpu.collectives == GpuCollectives::Nccl,
                 "--collectives {}: the CPU backend's ranks exchange through memory; "
                 "--collectives applies to --device cuda (leave it out)",
                 gpu_collectives_name(options.gpu.collectives));
    CPFILL_CHECK(!options.cuda || options.activations == ActRounding::None,
                 "rounded activations on the CPU are a study of the CUDA backend's fp8 or bf16 "
                 "path; on --device cuda use --weights fp8 or bf16");
    CPFILL_CHECK(!options.cuda || options.indexer_rounding == IndexerRounding::None,
                 "indexer rounding {} is a CPU study of a low-precision indexer; on --device cuda "
                 "the indexer's precision is --indexer (expected none)",
                 ops::indexer_rounding_name(options.indexer_rounding));
    if (options.cuda) format_ = resolve_gpu_format(options.weights, ckpt);
    LoadOptions load;
    load.threads = options.threads > 0 ? options.threads : default_thread_count();
    load.progress = true;  // drawn only when stderr is a terminal and the load takes over 1 s
    if (options.cuda) {
        load_gpu(ckpt, load);
    } else {
        LoadStats stats;
        ranks_ = load_rank_weights(ckpt, options.cp, load, &stats);
        for (ModelWeights& rank : ranks_)
            for (LayerWeights& L : rank.layers) {
                L.activations = options.activations;
                L.indexer_rounding = options.indexer_rounding;
            }
        load_bytes_ = stats.stored_bytes;
        rank_bytes_ = ranks_.back().bytes();
    }
    load_seconds_ = seconds_since(t0);
}

void PrefillEngine::load_gpu(const Checkpoint& ckpt, LoadOptions load) {
    const ModelConfig& cfg = ckpt.config();
    GpuGroupOptions go = options_.gpu;
    go.cp = options_.cp;
    go.weights = format_;
    const auto t0 = std::chrono::steady_clock::now();
    gpu_ = std::make_unique<GpuGroup>(go);
    gpu_setup_seconds_ = seconds_since(t0);
    // Under mpirun (local ranks given) only this process's ranks; otherwise all of them. From
    // the stored bytes: read ahead into pinned memory, decoded on the GPUs (docs/loading.md).
    // CPFILL_UPLOAD=host takes the older way instead (each layer read into host fp32 and
    // uploaded), for comparison.
    const char* env = std::getenv("CPFILL_UPLOAD");
    const std::string way = env ? env : "stored";
    CPFILL_CHECK(way == "stored" || way == "host",
                 "CPFILL_UPLOAD={}: expected stored (the default) or host", way);
    if (way == "stored") {
        stored_load_ = gpu_->load_stored(ckpt, load.threads, load.progress);
        load_bytes_ = stored_load_.bytes;
        rank_bytes_ = 0;  // no host weights
        return;
    }
    // The top-level tensors first, then one layer at a time: read into host fp32, uploaded,
    // dropped, so that host memory holds one layer of the local ranks, not the model.
    const LoadStats stats =
        load_rank_weights_in_parts(ckpt, options_.cp, load, options_.gpu.local_ranks,
                                   [&](int part, const std::vector<ModelWeights>& host) {
                                       std::vector<const ModelWeights*> views;
                                       for (const ModelWeights& w : host) views.push_back(&w);
                                       if (part < 0)
                                           gpu_->load_top(views);
                                       else
                                           gpu_->load_layer(part, views);
                                   });
    load_bytes_ = stats.stored_bytes;
    const std::vector<int>& local = options_.gpu.local_ranks;
    rank_bytes_ =
        rank_weights_host_bytes(cfg, options_.cp, {local.empty() ? options_.cp - 1 : local.back()});
}

RunResult PrefillEngine::run(const std::vector<std::vector<int32_t>>& requests,
                             const RunOptions& opt) {
    validate_requests(requests, config().vocab_size);
    RunResult r;
    const auto t0 = std::chrono::steady_clock::now();
    r.out = gpu_ ? run_gpu(requests, opt, &r.gpu) : run_cpu(requests, opt);
    r.prefill_seconds = seconds_since(t0);
    r.n_tokens = r.out.n_tokens;
    r.first_tokens = last_argmax(r.out.logits, config().vocab_size);
    return r;
}

PrefillOutput PrefillEngine::run_cpu(const std::vector<std::vector<int32_t>>& requests,
                                     const RunOptions& opt) {
    PrefillOptions p;
    p.cp = options_.cp;
    p.tbo = opt.tbo;
    p.chunk = opt.chunk;
    p.threads = options_.threads;
    p.all_logits = opt.all_logits;
    p.record_hidden = opt.record_hidden;
    p.record_topk = opt.record_topk;
    p.residual = options_.residual;
    p.comm = options_.comm;
    check_cpu_memory(cfg_, requests, p);
    std::vector<const ModelWeights*> views;
    for (const auto& w : ranks_) views.push_back(&w);
    return cp_prefill(views, requests, p);
}

PrefillOutput PrefillEngine::run_gpu(const std::vector<std::vector<int32_t>>& requests,
                                     const RunOptions& opt, GpuStats* stats) {
    GpuRunOptions g;
    g.tbo = opt.tbo;
    g.chunk = opt.chunk;
    g.all_logits = opt.all_logits;
    g.record_hidden = opt.record_hidden;
    g.record_topk = opt.record_topk;
    g.phase_timing = opt.phase_timing;
    g.fail_rank = opt.fail_rank;
    g.record_kv = opt.keep_kv;
    g.expert_gemm = opt.expert_gemm;
    g.residual = options_.residual;
    const std::vector<int>& local = options_.gpu.local_ranks;
    if (local.empty() || std::find(local.begin(), local.end(), 0) != local.end())
        check_gpu_host_logits(cfg_, requests, opt.all_logits);  // rank 0 holds them
    return gpu_->run(requests, g, stats);
}

double PrefillEngine::warm_up(int64_t budget, TboMode tbo, bool all_sizes) {
    const int64_t first =
        std::max<int64_t>(1, std::min<int64_t>(budget, options_.cuda ? kGpuWarmupTokens : 16));
    double seconds = 0;
    // The sizes: `first`, then (all_sizes, GPUs) the top of every smaller GEMM row class, largest
    // first, so that each class of the dense GEMMs has its plan.
    std::vector<int64_t> sizes{first};
    if (all_sizes && options_.cuda)
        for (int64_t n = 1; ops::gemm_plan_rows(n) < first; n = ops::gemm_plan_rows(n) + 1)
            sizes.insert(sizes.begin() + 1, ops::gemm_plan_rows(n));
    if (gpu_) {
        // The routed experts' plans for every row class a batch of `first` tokens can give an
        // expert (a warm-up batch reaches only the counts its own routing gives).
        const auto t0 = std::chrono::steady_clock::now();
        gpu_->prepare_expert_plans(first);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    for (const int64_t n : sizes) {
        // Ids from a fixed LCG, spread over the vocabulary as text is.
        std::vector<int32_t> ids;
        uint64_t x = 0x9E3779B97F4A7C15ull;
        while (static_cast<int64_t>(ids.size()) < n) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            ids.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(cfg_.vocab_size)));
        }
        RunOptions w;
        w.tbo = tbo;
        seconds += run({ids}, w).prefill_seconds;
    }
    return seconds;
}

GpuGroup::WeightStats PrefillEngine::gpu_weight_stats() const {
    return gpu_ ? gpu_->weight_stats() : GpuGroup::WeightStats{};
}

GpuWeightFormat stored_gpu_format(const Checkpoint& ckpt) {
    GpuWeightFormat f = GpuWeightFormat::Bf16;
    for (const WeightSpec& spec : ckpt.specs().all()) {
        if (spec.cls != WeightClass::Fp8Linear && spec.cls != WeightClass::Fp4Expert) continue;
        const StoredWeight w = ckpt.stored(spec.name);
        if (w.scale_name.empty()) continue;
        // Routed experts stored packed (two e2m1 per byte): kept so on the GPU.
        if (spec.cls == WeightClass::Fp4Expert && (w.dtype == DType::I8 || w.dtype == DType::U8))
            return GpuWeightFormat::Fp4;
        f = GpuWeightFormat::Fp8;
    }
    return f;
}

GpuWeightFormat resolve_gpu_format(const std::string& weights, const Checkpoint& ckpt) {
    if (weights == "auto") return stored_gpu_format(ckpt);
    return parse_gpu_weight_format(weights);
}

int32_t argmax(const float* v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return static_cast<int32_t>(best);
}

}  // namespace cpfill
