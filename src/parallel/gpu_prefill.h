// The context-parallel prefill on GPUs (docs/design.md §4–§5), CUDA backend: a GpuGroup is one CP
// group of C ranks, one GPU each, joined by NCCL. This process drives some of them (all of them,
// one thread per GPU, in the threaded mode; one under `mpirun`). Each rank holds all attention
// weights and a 1/C slice of every expert as bf16 on its GPU, and runs the same plan as the CPU
// backend (cp_prefill.h): per layer an all-gather of the packed attention inputs, an all-gather of
// the MoE input and a reduce-scatter of the MoE partial sums, with two-batch overlap on a comm
// stream.
//
// No CUDA types in this header: the CPU-only build compiles it and its stub throws.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/weight_bytes.h"
#include "model/weights.h"
#include "parallel/cp_prefill.h"

namespace cpfill {

class Checkpoint;

using NcclId = std::array<char, 128>;  // ncclUniqueId's bytes

// How the ranks of a group exchange their rows (`--collectives`; docs/parallel.md, "Collectives:
// NCCL or the copy engines"): NCCL's kernels, or peer copies by the GPUs' copy engines ordered by
// stream-side flags (runtime/cuda/ce_comm.h; every rank in this process, so not under mpirun).
enum class GpuCollectives { Nccl, Ce };
GpuCollectives parse_gpu_collectives(const std::string& s);  // "nccl" or "ce"
const char* gpu_collectives_name(GpuCollectives c);

struct GpuGroupOptions {
    int cp = 1;                    // C: ranks in the group
    std::vector<int> local_ranks;  // ranks this process drives (empty: all, threaded mode)
    std::vector<int> devices;      // CUDA device of each local rank (empty: local rank index)
    NcclId nccl_id{};              // shared by all processes (ignored in the threaded mode)
    std::chrono::milliseconds deadline{600000};  // longest host wait before an error
    // How the GPUs hold the matrices (`--weights`, model/weight_bytes.h): bf16, or fp8 where the
    // release ships fp8 / fp4.
    GpuWeightFormat weights = GpuWeightFormat::Bf16;
    // How the GPUs score the indexer (`--indexer`): Auto follows the weights (GpuIndexer).
    GpuIndexer indexer = GpuIndexer::Auto;
    GpuCollectives collectives = GpuCollectives::Nccl;
};

// The routed experts' GEMMs (docs/fp8.md, "The grouped fp8 expert GEMM"):
// * Streams: a cuBLASLt GEMM pair per expert, spread over `expert_streams` CUDA streams;
// * Grouped: one launch per GEMM for all experts of a sub-batch — fp8 experts with 128×128 weight
//   tiles through cpfill's own kernel (ops/cuda/grouped_fp8.h, compute capability 9.0), bf16
//   experts through the same kernel with bf16 operands (grouped_gemm_bf16: d_model a multiple of
//   128, the rank's width of 64), else through cublasGemmGroupedBatchedEx (half the rate of
//   Streams on the H200 with CUDA 13's cuBLAS: 345 vs 748 TFLOP/s at V4-Flash's shapes; kept for
//   comparison); experts it cannot take (fp8 with (row, 128) scales, another GPU) use Streams;
// * Auto: the faster as measured on the H200 (docs/fp8.md): Grouped for fp8 experts (cpfill's
//   kernel, TMA-store epilogue) while a layer has at most 512 rows per expert on average (short
//   batches: many small GEMMs), else Streams; the same for bf16 experts (cpfill's kernel with
//   bf16 operands, register epilogue) up to 256 rows per expert (session 28).
enum class ExpertGemm { Auto, Streams, Grouped };

struct GpuRunOptions {
    TboMode tbo = TboMode::Off;
    // > 0: the token stream in chunks of this many tokens through the KV store (as the CPU
    // backend's PrefillOptions::chunk). 0: one pass, or the largest power-of-two chunk that fits
    // when one pass does not (docs/parallel.md, "Chunked prefill on GPUs").
    int64_t chunk = 0;
    bool all_logits = false;
    bool record_hidden = false;  // as PrefillOptions (rank 0's output)
    bool record_topk = false;    // indexer selections and router choices (PrefillOutput)
    bool record_kv = false;      // rank 0's output gets the KV state to export (PrefillOutput::kv)
    // Timing only: every collective is skipped and its receive buffer left as it is, so the
    // result is WRONG; used to measure exposed communication (docs/performance.md).
    bool no_comm = false;
    bool phase_timing = false;  // CUDA events around each phase on rank 0 (GpuStats::phases)
    int fail_rank = -1;         // tests: this rank throws at layer 1, before its collectives
    // Tests: each GPU counts as having at most this many bytes for the workspace (0: what it
    // has), so that a small batch meets the out-of-memory paths (automatic chunking, errors).
    size_t workspace_limit = 0;
    ExpertGemm expert_gemm = ExpertGemm::Auto;
    // Where an mHC post-mix meets the next site's pre-mix, one fused op (ops/cuda/mhc.h
    // mhc_post_pre: the residual read twice and written once instead of read five times); false:
    // mhc_post, mhc_pre and the RMSNorm apart (tests, bench --mhc-fused off).
    bool mhc_fused = true;
    int expert_streams = 4;  // ExpertGemm::Streams: CUDA streams the GEMM pairs go over (1–8)
    // The mHC residual's storage (parallel/cp_prefill.h; ops/cuda/mhc.h): bf16 halves its bytes,
    // in the workspace and at every site boundary.
    ResidualDtype residual = ResidualDtype::Fp32;
};

// Seconds on rank 0's GPU, from CUDA events. Phases partition the layer loop's compute stream:
// attention = projections, the KV-store update and the core attention; indexer = indexer scoring
// and top-k; compressor = pooling of compressed entries; moe = router, permutation and expert
// GEMMs; collectives = waits of the compute stream on gathers and scatters (the exposed part);
// other = mHC, norms, embedding and head.
struct GpuPhases {
    double attention = 0, indexer = 0, compressor = 0, moe = 0, collectives = 0, other = 0;
};
// (CUDA sources compile as C++17: no defaulted comparison.)
inline bool operator==(const GpuPhases& a, const GpuPhases& b) {
    return a.attention == b.attention && a.indexer == b.indexer && a.compressor == b.compressor &&
           a.moe == b.moe && a.collectives == b.collectives && a.other == b.other;
}

struct GpuStats {
    double seconds = 0;                 // wall clock of the prefill on the host (all ranks done)
    std::vector<double> layer_seconds;  // per layer (rank 0, CUDA events; with phase_timing)
    GpuPhases phases;                   // with phase_timing
    size_t peak_bytes = 0;              // the largest per-GPU device memory in use
    size_t weight_bytes = 0;            // per-GPU bytes of weights (largest rank)
    bool tbo_used = false;
    int64_t chunk = 0;  // tokens per chunk the run used (0: one pass)
    int64_t n_tokens = 0;
    // What a cold run pays that a warm one does not: GEMM plans made during the run (all local
    // ranks; ops/cuda/gemm.h gemm_plan_stats) with their host seconds, and rank 0's seconds
    // growing its workspace arena (0 when the arena from an earlier run was large enough).
    int64_t gemm_plans = 0;
    double gemm_plan_seconds = 0;
    double arena_seconds = 0;
    int grouped_fp8_layers = 0;  // layers whose routed experts ran the grouped fp8 kernel
    // … the same kernel with bf16 operands (grouped_gemm_bf16); under Auto the layers that may,
    // as for fp8 (a batch with many rows per expert still takes the GEMM pairs)
    int grouped_bf16_layers = 0;
};

// What one GPU needs for a prefill of `n_tokens` (one batch, in chunks of `chunk` tokens when
// > 0) on C ranks: the weights of one rank and the planned workspace (activations of a chunk, the
// KV store of the whole prompt, collective buffers), in bytes.
struct GpuMemoryPlan {
    size_t weights = 0;
    size_t workspace = 0;
    size_t total() const { return weights + workspace; }
};
// The smallest chunk automatic chunking tries (below it the expert GEMMs run on few rows); a
// batch that does not fit in chunks of it is refused (and `bench` skips its row).
constexpr int64_t kMinAutoChunk = 1024;

GpuMemoryPlan plan_gpu_memory(const ModelConfig& cfg, int64_t n_tokens, int n_requests, int cp,
                              bool tbo, bool all_logits,
                              GpuWeightFormat format = GpuWeightFormat::Bf16, int64_t chunk = 0,
                              GpuIndexer indexer = GpuIndexer::Auto,
                              ResidualDtype residual = ResidualDtype::Fp32);
// The `weights` part alone needs no GPU: gpu_weight_bytes (model/weight_bytes.h).

// Ceilings measured on this machine (docs/performance.md): bf16 and block-scaled fp8 GEMM 8192³
// through cuBLASLt,
// device-to-device copy (read + write bytes / s) and, with ≥ 2 GPUs, the all-gather bus bandwidth
// at 1 GiB on min(devices, 2) GPUs by NCCL and by the copy engines (0 with one GPU).
struct GpuCeilings {
    double gemm_tflops = 0;
    double fp8_gemm_tflops = 0;  // e4m3, 128×128 weight / 1×128 activation block scales
    double hbm_gbps = 0;
    double allgather_busbw_gbps = 0;
    int allgather_gpus = 0;
    double ce_allgather_busbw_gbps = 0;  // the same all-gather by the copy engines (CeComm)
};
GpuCeilings measure_gpu_ceilings();

// The GPU kernels the prefill of `cfg` takes where there is a choice (CPFILL_ATTENTION;
// docs/cli.md), on device 0, in words for reports: "attention_wg (attention)".
std::string gpu_kernel_choices(const ModelConfig& cfg);

class GpuGroup {
  public:
    // Joins the group (a collective call across processes: every process of the group calls it).
    // Checks that the devices exist; initialises NCCL and its duplicate communicator.
    explicit GpuGroup(const GpuGroupOptions& opt);
    ~GpuGroup();
    GpuGroup(const GpuGroup&) = delete;
    GpuGroup& operator=(const GpuGroup&) = delete;

    // A fresh NCCL unique id (to broadcast to the other processes before they construct).
    static NcclId new_nccl_id();

    int cp() const;
    const std::vector<int>& local_ranks() const;

    // Uploads weights: rank_weights[i] is local rank i's host view (expert slice {rank, C}).
    // load_top, then load_layer for every layer.
    void load(const std::vector<const ModelWeights*>& rank_weights);
    // The same in parts, so that the host holds one layer at a time (load_rank_weights with
    // LoadOptions::part): load_top drops the weights held, checks that the whole model's bf16
    // weights fit into each GPU (else an error with the bytes and a --cp that fits) and uploads
    // the top-level tensors; load_layer uploads layer `layer` of each rank's view.
    void load_top(const std::vector<const ModelWeights*>& rank_weights);
    void load_layer(int layer, const std::vector<const ModelWeights*>& rank_weights);
    // Every local rank's weights straight from the checkpoint's stored bytes, after the same fit
    // check as load_top: `threads` threads read ahead into pinned host memory, each GPU copies
    // its part as stored and decodes it (docs/loading.md, "GPU upload from stored bytes"; no host
    // f32; the same device weights as load_top + load_layer). `progress`: a progress line of the
    // bytes read (io/progress.h: drawn only on a terminal).
    struct StoredLoad {
        size_t bytes = 0;    // stored bytes read
        size_t misses = 0;   // pieces the uploads read themselves (the readers were behind)
        double seconds = 0;  // the whole of load_stored
        double reader_wait_s = 0, upload_wait_s = 0;  // StoredReader's waits, summed
    };
    StoredLoad load_stored(const Checkpoint& ck, int threads, bool progress);
    // Random weights (in the group's format) generated on each GPU (benchmarks: nothing to read or
    // upload): scaled like random_checkpoint (io/random_checkpoint.h), expert slices of the rank's
    // part.
    void randomize(const ModelConfig& cfg, uint64_t seed);

    // Makes every local rank's routed-expert GEMM plans for each row class up to max_rows rows per
    // expert (cuda::gpu_moe_plan_experts, once per kind of expert weights among the layers), so
    // that no batch pays cuBLASLt's heuristic per expert. Returns the plans made on rank 0's
    // process (GEMM pairs × classes).
    int64_t prepare_expert_plans(int64_t max_rows);

    // The local ranks' weights: the largest rank's device bytes, and the fp8 values quantised and
    // those not exact (GpuWeights::fp8_inexact) summed over the ranks; whether the indexer scores
    // in fp8 (GpuWeights::indexer_fp8: fp8 or fp4 weights on Hopper).
    struct WeightStats {
        size_t bytes = 0;
        uint64_t fp8_values = 0, fp8_inexact = 0;
        bool indexer_fp8 = false;
    };
    WeightStats weight_stats() const;

    // Runs the prefill. Rank 0's process gets logits and records; other processes get an output
    // with empty logits. Throws the first local error; peers are aborted, never left hanging.
    PrefillOutput run(const std::vector<std::vector<int32_t>>& requests, const GpuRunOptions& opt,
                      GpuStats* stats = nullptr);

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace cpfill
