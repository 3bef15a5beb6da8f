// The context-parallel prefill on CPU ranks (docs/design.md §4–§5): C rank threads, each holding
// all attention weights and a 1/C slice of every expert, run the layers over round-robin local rows
// with all-gathers of attention inputs and MoE inputs and a reduce-scatter of the MoE sums. With
// two-batch overlap the batch is split in two sub-batches whose stages alternate so that one's
// collectives run on the comm stream under the other's compute. CP = 1 is the same code with
// trivial collectives: it is also the single-rank reference.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/kv_store.h"
#include "model/weights.h"
#include "runtime/communicator.h"

namespace cpfill {

enum class TboMode { Off, On, Auto };

// The mHC residual h between the sites (docs/numerics.md, "The residual in bf16"): fp32 (the
// default: HF float32's precision) or bf16, rounded to nearest even after the embedding and after
// every update, as the release's reference inference keeps it. The arithmetic is fp32 either way;
// on CPU ranks bf16 is the same rounding applied to fp32 rows (the reference for the GPUs' bf16).
enum class ResidualDtype { Fp32, Bf16 };
const char* residual_dtype_name(ResidualDtype d);
// "fp32" or "bf16"; anything else is an error naming what was expected.
ResidualDtype parse_residual_dtype(const std::string& name);

struct PrefillOptions {
    int cp = 1;
    TboMode tbo = TboMode::Off;
    int64_t chunk = 0;        // > 0: process the token stream in chunks of this many tokens
    int threads = 0;          // CPU threads in all (0: all hardware threads), shared by the ranks
    bool all_logits = false;  // logits of every position instead of each request's last
    bool record_hidden = false;  // residual streams after the embedding, each layer, final norm
    bool record_topk = false;    // indexer selections of CSA layers and the router's choices
    ResidualDtype residual = ResidualDtype::Fp32;
    LocalCommOptions comm;
};

struct PrefillOutput {
    std::vector<Tensor> logits;  // per request: f32 [vocab] or [len, vocab] (all_logits)
    // record_hidden: n_layers + 2 tensors over all tokens in request order: f32 [T, hc, d_model]
    // after the embedding and after each layer, then f32 [T, d_model] after hc_head + norm.
    std::vector<Tensor> hidden;
    std::vector<Tensor> topk;    // record_topk: per layer i32 [T, index_topk] (CSA layers only)
    std::vector<Tensor> routes;  // record_topk: per layer i32 [T, top_k], the routed experts
    KvStore kv;                  // rank 0's KV store after the last chunk
    bool tbo_used = false;
    int64_t chunk = 0;  // tokens per chunk the run used (0: one pass)
    int64_t n_tokens = 0;
};

// Host bytes a CPU-backend prefill of `requests` allocates beyond the weights, all ranks together:
// per rank its local rows' activations, the gathered rows of a layer, the collective buffers, the
// MoE of all rows, and a KV store over every token (window keys of every position, entries,
// indexer keys, each counted twice for the growth of their vectors); with --chunk the activations
// follow the largest chunk and the KV store the whole prompt. Plus the outputs. An estimate from
// the buffers' sizes: the CLI checks it against the host memory left before a run.
size_t cpu_prefill_bytes(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& requests,
                         const PrefillOptions& opt);

// An output with zeroed logits (per request [vocab], or [len, vocab] with all_logits) and, when
// asked for, the hidden-state and indexer records over all tokens; shared by both backends.
PrefillOutput make_prefill_output(const ModelConfig& cfg,
                                  const std::vector<std::vector<int32_t>>& requests,
                                  bool all_logits, bool record_hidden, bool record_topk);

// rank_weights[r]: the weights of rank r (its expert slice r of C). Requests must be valid
// (validate_requests). Throws the first rank's error; peers are aborted, never left hanging.
PrefillOutput cp_prefill(const std::vector<const ModelWeights*>& rank_weights,
                         const std::vector<std::vector<int32_t>>& requests,
                         const PrefillOptions& opt);

// Whether `--tbo auto` splits a batch of n_tokens on cp ranks (documented in docs/parallel.md).
bool tbo_pays(const ModelConfig& cfg, int64_t n_tokens, int cp);

// The CUDA backend's cost model for `--tbo auto` (docs/parallel.md): TBO hides the per-layer
// collectives (bytes / bus bandwidth) but splits every expert GEMM in two, which costs a fixed
// overhead per extra GEMM (measured on H200: ≈ 12 µs). Splits when the hidden time exceeds it.
struct TboCostModel {
    double busbw_gbps = 250;  // NCCL all-gather bus bandwidth (docs/performance.md, 2×H200)
    // Per extra expert GEMM launched by the split (refitted after the expert streams:
    // docs/parallel.md).
    double split_overhead_s = 9e-6;
};
double gpu_tbo_gain_seconds(const ModelConfig& cfg, int64_t n_tokens, int cp,
                            const TboCostModel& m = {});
bool gpu_tbo_pays(const ModelConfig& cfg, int64_t n_tokens, int cp, const TboCostModel& m = {});

}  // namespace cpfill
