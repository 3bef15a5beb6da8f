// The `cpfill bench` report (docs/bench.md): the FLOP model of a prefill (docs/architecture.md
// §5.1), one row per (cp, tbo, prompt length) holding what was measured and the ratios derived from
// it (docs/performance.md: MFU, CP speed-up, exposed communication, full-model projection), and
// three writers: a markdown table, JSON and an SVG plot. No GPU code here: tools/cmd_bench.cpp runs
// the prefills and fills the measured fields; finalize_report derives the rest.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {

// Dense bf16 peak of one H200 (fp8 GEMMs are counted against it too, docs/performance.md).
inline constexpr double kPeakFlopsPerGpu = 989e12;

// FLOPs (1 multiply-add = 2) of one layer over the prefill of one request of `length` tokens,
// summed exactly over query positions t = 0 … length−1.
struct LayerFlops {
    double mhc = 0;              // 2 sites: mix projection, collapse, post, comb mix
    double attn_proj = 0;        // wq_a, wq_b, wkv, grouped wo_a, wo_b
    double compressor = 0;       // compressor wkv + wgate (CSA: 2·head_dim wide, overlapping)
    double indexer_fixed = 0;    // indexer wq_b, weights_proj, indexer compressor (CSA)
    double core_attention = 0;   // 4·n_heads·head_dim per key: window + selected/eligible entries
    double indexer_scoring = 0;  // 2·index_n_heads·index_head_dim per eligible entry (CSA)
    double moe = 0;              // top_k routed + shared SwiGLU experts, router
    double total() const;
};
// Hash-routed layers still compute the router's scores (they renormalise the learned scores of
// the table's experts, docs/architecture.md §7.18), so `mlp` does not change the count.
LayerFlops layer_flops(const ModelConfig& cfg, AttnType attn, MlpType mlp, int64_t length);
double head_flops(const ModelConfig& cfg);  // lm head for the last token only: 2·D·V
// Every layer of cfg.layer_types plus the head.
double prefill_flops(const ModelConfig& cfg, int64_t length);

// cfg with n_layers layers: truncated, or extended by repeating the last two attention types
// (CSA/HCA alternate in both releases) and the last MoE routing type (hash routing is a prefix).
ModelConfig with_layer_count(const ModelConfig& cfg, int n_layers);

double median(std::vector<double> v);  // 0 for an empty list
std::string format_length(int64_t n);  // 8192 → "8k", 1048576 → "1M", 5000 → "5000"

// Seconds per phase of the phase-timing run.
using BenchPhases = GpuPhases;
// {"attention": s, "indexer": s, …}: the "phases_s" object of the bench JSON and of `run --json`.
nlohmann::json phases_to_json(const GpuPhases& p);

// Ceilings measured on the machine in the same run (GpuCeilings).
struct BenchCeilings {
    double gemm_tflops = 0;
    double fp8_gemm_tflops = 0;  // block-scaled fp8 (128×128 weight tiles) 8192³; 0: not measured
    double hbm_gbps = 0;
    double allgather_busbw_gbps = 0;
    int allgather_gpus = 0;
    // The same all-gather by the copy engines (--collectives ce); 0: not measured (one GPU, or a
    // report written before it).
    double ce_allgather_busbw_gbps = 0;
    bool operator==(const BenchCeilings&) const = default;
};

// Lower bounds of each phase of one prefill on one GPU (docs/bench.md, "Phases against their
// floors"): the phase's FLOPs (layer_flops) at the same run's GEMM ceiling — the block-scaled fp8
// one for the linears an fp8 row may run in fp8 (attention and indexer projections, experts,
// router), bf16 for the rest (compressor, attention core, and the indexer scores unless
// `fp8_indexer`: then at the fp8 one) —, and for `other` (mHC
// and norms: CUDA-core work over the residual streams) its bytes at the HBM copy rate: each of
// a layer's two mHC sites reads and writes the hc streams once (2 · hc · d_model · residual_bytes
// per token: 4 for an fp32 residual, 2 for bf16). Work divides over the cp ranks; collectives are
// not modelled (0). nullopt when a ceiling it needs was not measured.
std::optional<GpuPhases> phase_floors(const ModelConfig& cfg, int64_t length, int cp, bool fp8,
                                      bool fp8_indexer, const std::optional<BenchCeilings>& c,
                                      int residual_bytes = 4);

struct LayerTypeTime {
    AttnType type = AttnType::Sliding;
    int layers = 0;           // layers of this type in the benchmarked model
    double mean_seconds = 0;  // their mean time in the phase-timing run
    bool operator==(const LayerTypeTime&) const = default;
};

// The full model's TTFT estimated from a (slice) measurement: the measured mean time per layer of
// each attention type times the full model's count of that type, plus the measured remainder
// (TTFT − Σ layer times: embedding, head, host work). A projection, not a measurement.
struct ProjectionTarget {
    std::string model;  // "V4-Flash", "V4-Pro"
    int sliding = 0, csa = 0, hca = 0;
    bool operator==(const ProjectionTarget&) const = default;
};
// V4-Flash (2 sliding + 21 CSA + 20 HCA) for presets named flash*, V4-Pro (30 CSA + 31 HCA) for
// pro*, none otherwise.
std::optional<ProjectionTarget> projection_target(const std::string& preset);

struct Projection {
    ProjectionTarget target;
    double remainder_seconds = 0;
    double ttft = 0;   // seconds
    double flops = 0;  // of the full model at this length
    double mfu = 0;
    double tokens_per_s_per_gpu = 0;
    bool operator==(const Projection&) const = default;
};

struct BenchRow {
    // Set by the runner.
    int cp = 1;
    std::string tbo = "off";            // as asked: off, on or auto
    std::string weights = "bf16";       // how the GPUs held the matrices: bf16, fp8 or fp4
    std::string indexer = "bf16";       // how they scored the indexer: bf16 or fp8
    std::string residual = "fp32";      // how they kept the mHC residual: fp32 or bf16
    int64_t length = 0;                 // prompt tokens of the one request
    std::string skipped;                // why the row was not measured; empty when it was
    std::vector<double> ttft_runs;      // seconds of each timed run
    std::vector<double> no_comm_runs;   // seconds with every collective skipped (cp > 1)
    double phase_run_seconds = 0;       // the run with phase timing
    BenchPhases phases;                 // of that run
    std::vector<double> layer_seconds;  // per layer, of that run (empty: not available)
    uint64_t peak_bytes = 0;            // device memory in use, largest GPU
    bool tbo_used = false;
    int64_t chunk = 0;  // tokens per chunk the prefill used (0: one pass)

    // Derived by finalize_report.
    double flops = 0;  // FLOPs counted for this prefill (§5.1)
    double ttft = 0;   // median of ttft_runs, seconds
    double tokens_per_s = 0;
    double tokens_per_s_per_gpu = 0;
    double mfu = 0;
    std::optional<double> speedup;       // TTFT(cp=1, same length and tbo) / TTFT
    std::optional<double> ttft_no_comm;  // median of no_comm_runs
    std::optional<double> exposed;       // ttft / ttft_no_comm − 1
    std::vector<LayerTypeTime> layer_types;
    std::optional<BenchPhases> floors;  // phase_floors of this row
    std::optional<Projection> projection;
    std::string projection_note;  // why there is no projection

    bool measured() const { return skipped.empty(); }
    bool operator==(const BenchRow&) const = default;
};

struct BenchReport {
    std::string preset;
    ModelConfig config;  // as benchmarked (after --layers)
    std::string device;  // GPU name
    int gpus = 0;        // GPUs visible
    int repeat = 0, warmup = 0;
    uint64_t seed = 0;
    // --indexer: "auto" (fp8 in the fp8 and fp4 rows on Hopper, bf16 in the others), "bf16" or
    // "fp8" in every row.
    std::string indexer = "auto";
    // The interchangeable GPU kernels the run took (gpu_kernel_choices); empty in reports written
    // before it was recorded.
    std::string kernels;
    // --collectives: "nccl" or "ce" (the copy engines); reports before it: "nccl".
    std::string collectives = "nccl";
    std::optional<BenchCeilings> ceilings;
    std::vector<BenchRow> rows;
};

// Fills every row's derived fields from the measured ones and report.config.
void finalize_report(BenchReport& report);

std::string report_markdown(const BenchReport& report);
nlohmann::json report_to_json(const BenchReport& report);
// Throws cpfill::Error naming the field when `j` is not a report written by report_to_json.
BenchReport report_from_json(const nlohmann::json& j);
// Tokens/s per GPU against prompt length (log scale), one polyline per (cp, tbo).
std::string report_svg(const BenchReport& report);

}  // namespace cpfill
