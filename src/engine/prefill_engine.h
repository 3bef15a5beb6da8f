// PrefillEngine: what tools/ talks to. Loads a model folder once, makes each CP rank's view of the
// weights (attention replicated, experts sliced 1/C), runs batches of requests through the
// context-parallel prefill and returns logits, first tokens and timings. CPU backend, or the CUDA
// backend (one GPU per rank, NCCL) with `cuda`.
#pragma once

#include <string>
#include <vector>

#include "model/weights.h"
#include "parallel/cp_prefill.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {

struct EngineOptions {
    int threads = 0;  // CPU threads in all (0: all hardware threads)
    int cp = 1;       // ranks (threads of this process on the CPU backend)
    LocalCommOptions comm;
    bool cuda = false;  // run on GPUs (ranks = GPUs 0 … cp − 1 of this process, or under mpirun)
    GpuGroupOptions gpu;  // cuda: local ranks, devices and NCCL id (empty: threaded mode)
    // cuda: how the GPUs hold the matrices (`--weights`): "auto" (as the checkpoint stores them:
    // fp4 when its routed experts are packed fp4, fp8 when its linears are block-quantised, else
    // bf16), "bf16", "fp8" or "fp4" (model/weight_bytes.h, docs/fp8.md). The CPU backend computes
    // in fp32 from the dequantised weights and takes "auto" only.
    std::string weights = "auto";
    // CPU only, a numerics study (docs/fp8.md, "Fidelity"): round the inputs of the linears the
    // CUDA backend runs in fp8 as its fp8 path does (Fp8), or to bf16 as its bf16 path feeds them
    // (Bf16; LayerWeights::activations), so that the fp32 reference carries the same activation
    // rounding as the GPU's run.
    ActRounding activations = ActRounding::None;
    // CPU only, a numerics study (docs/fp8.md, "The indexer's queries and keys rounded"): round
    // the lightning indexer's queries and keys to fp8, or to the release's Hadamard + fp4, before
    // it scores them (LayerWeights::indexer_rounding), to see whether its top-k selections hold.
    IndexerRounding indexer_rounding = IndexerRounding::None;
    // How every run keeps the mHC residual (`--residual`, parallel/cp_prefill.h): fp32, or bf16
    // as the release's reference does — on GPUs half its bytes, on CPU ranks the same rounding.
    ResidualDtype residual = ResidualDtype::Fp32;
};

struct RunOptions {
    TboMode tbo = TboMode::Off;
    int64_t chunk = 0;
    bool all_logits = false;
    bool record_hidden = false;
    bool record_topk = false;
    bool phase_timing = false;  // cuda: per-phase times in RunResult::gpu
    int fail_rank = -1;         // cuda, tests: GpuRunOptions::fail_rank
    bool keep_kv = false;       // cuda: download the KV state into RunResult::out.kv (the CPU
                                // backend always keeps it)
    ExpertGemm expert_gemm = ExpertGemm::Auto;  // cuda: GpuRunOptions::expert_gemm
};

struct RunResult {
    PrefillOutput out;
    std::vector<int32_t> first_tokens;  // argmax of each request's last-position logits
    int64_t n_tokens = 0;
    double prefill_seconds = 0;
    GpuStats gpu;  // cuda only
};

class PrefillEngine {
  public:
    // Reads the checkpoint with options.threads threads, each rank's expert slices directly
    // (model/weights.h load_rank_weights); a progress line on stderr when it is a terminal.
    PrefillEngine(const std::string& model_dir, const EngineOptions& options);
    const ModelConfig& config() const { return cfg_; }
    int cp() const { return options_.cp; }
    double load_seconds() const { return load_seconds_; }
    // Load throughput: bytes of the stored tensors read (weights and scales) / load_seconds().
    double load_gbps() const { return load_seconds_ > 0 ? load_bytes_ * 1e-9 / load_seconds_ : 0; }
    // fp32 bytes each rank holds: attention and head replicated, experts 1/C.
    size_t rank_weight_bytes() const { return rank_bytes_; }
    // cuda: the format the GPUs hold (auto resolved) and their weights' stats.
    GpuWeightFormat gpu_weight_format() const { return format_; }
    GpuGroup::WeightStats gpu_weight_stats() const;
    // cuda: the stored upload's figures (all zero after CPFILL_UPLOAD=host).
    const GpuGroup::StoredLoad& gpu_stored_load() const { return stored_load_; }
    double gpu_setup_seconds() const { return gpu_setup_seconds_; }  // part of load_seconds
    // Validates the requests (non-empty, ids < vocab) and runs the prefill.
    RunResult run(const std::vector<std::vector<int32_t>>& requests, const RunOptions& opt);
    // One untimed batch through the whole model, so that the first real one is warm (docs/cli.md
    // "Warm-up"): one request of pseudo-random ids (not the batch to come), at most `budget` of
    // them. On GPUs up to kGpuWarmupTokens — the GEMM plans, the kernels that the larger shapes
    // pick and the workspace arena are then made before the real batch — on CPUs 16 (thread
    // pools, first-touch page faults). On GPUs also the routed experts' GEMM plans of every row
    // class up to that many rows per expert (GpuGroup::prepare_expert_plans). Returns its seconds.
    // all_sizes (a server, whose requests come in every size, and each row class of a GEMM
    // (ops/gemm_plan_rows.h) picks its own plan and kernel): on GPUs a further batch at the top
    // of every smaller class, largest first, down to 1 token.
    static constexpr int64_t kGpuWarmupTokens = 8192;
    double warm_up(int64_t budget, TboMode tbo, bool all_sizes = false);

  private:
    // cuda: creates the GPU group and loads it part by part (LoadOptions::part).
    void load_gpu(const Checkpoint& ckpt, LoadOptions load);
    PrefillOutput run_cpu(const std::vector<std::vector<int32_t>>& requests, const RunOptions& opt);
    PrefillOutput run_gpu(const std::vector<std::vector<int32_t>>& requests, const RunOptions& opt,
                          GpuStats* stats);
    EngineOptions options_;
    ModelConfig cfg_;
    std::vector<ModelWeights> ranks_;  // attention and head tensors shared, experts 1/C each
    std::unique_ptr<GpuGroup> gpu_;    // cuda: the GPUs of this process's ranks
    size_t rank_bytes_ = 0;            // fp32 bytes of one rank's weights as loaded
    double load_seconds_ = 0;
    size_t load_bytes_ = 0;  // stored bytes read
    GpuWeightFormat format_ = GpuWeightFormat::Bf16;
    GpuGroup::StoredLoad stored_load_;  // cuda, stored upload
    double gpu_setup_seconds_ = 0;      // cuda: creating the GPU group (contexts, NCCL)
};

// The format `--weights auto` means for a checkpoint: fp4 when its routed experts are stored as
// packed fp4, fp8 when its fp8-class linears or experts are block-quantised fp8, else bf16.
GpuWeightFormat stored_gpu_format(const Checkpoint& ckpt);
// `--weights` (auto, bf16, fp8 or fp4) for a checkpoint: auto resolved by stored_gpu_format.
GpuWeightFormat resolve_gpu_format(const std::string& weights, const Checkpoint& ckpt);

// Index of the largest value (first one on ties).
int32_t argmax(const float* v, int64_t n);

}  // namespace cpfill
