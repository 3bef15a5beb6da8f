// DeepSeek-V4 weights as fp32 host tensors for the CPU backend, loaded from a Checkpoint by
// canonical (official) names. Routed and shared experts may be loaded as a 1/parts slice of their
// hidden width (rows of w1/w3, columns of w2) for the tensor-parallel MoE of docs/design.md §4;
// load_rank_weights reads all ranks' views at once, in parallel (docs/loading.md).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "ops/act_rounding.h"
#include "ops/indexer_round.h"

namespace cpfill {

using ops::ActRounding;
using ops::IndexerRounding;

class Checkpoint;

struct MhcWeights {
    Tensor fn;     // f32 [(2 + hc) · hc, hc · d_model]
    Tensor base;   // f32 [(2 + hc) · hc]
    Tensor scale;  // f32 [3]
};

struct CompressorWeights {
    Tensor wkv;    // f32 [w · dim, d_model], w = 2 with the CSA overlap, else 1
    Tensor wgate;  // f32 [w · dim, d_model]
    Tensor ape;    // f32 [ratio, w · dim] position bias
    Tensor norm;   // f32 [dim]
};

struct AttentionWeights {
    Tensor wq_a, q_norm, wq_b;         // [q_rank, d_model], [q_rank], [n_heads · head_dim, q_rank]
    Tensor wkv, kv_norm;               // [head_dim, d_model], [head_dim]
    Tensor wo_a;                       // [o_groups · o_rank, n_heads · head_dim / o_groups]
    Tensor wo_b;                       // [d_model, o_groups · o_rank]
    Tensor sink;                       // [n_heads]
    CompressorWeights compressor;      // CSA / HCA only
    Tensor idx_wq_b;                   // CSA: [index_n_heads · index_head_dim, q_rank]
    Tensor idx_weights_proj;           // CSA: [index_n_heads, d_model]
    CompressorWeights idx_compressor;  // CSA: dim = index_head_dim
};

struct MoeWeights {
    Tensor gate;              // [n_experts, d_model]
    Tensor gate_bias;         // learned routing: [n_experts]
    Tensor tid2eid;           // hash routing: i64 [vocab, top_k]
    std::vector<Tensor> w13;  // per expert [2 · slice, d_model]: w1 rows then w3 rows
    std::vector<Tensor> w2;   // per expert [d_model, slice]
    Tensor shared_w13;        // [2 · slice, d_model]
    Tensor shared_w2;         // [d_model, slice]
};

struct LayerWeights {
    AttnType type;
    MlpType mlp;
    MhcWeights hc_attn, hc_ffn;
    Tensor attn_norm, ffn_norm;  // [d_model]
    AttentionWeights attn;
    MoeWeights moe;
    // A numerics study, not the model: the inputs of the linears the CUDA backend runs in fp8
    // (wq_a, wq_b, wkv, wo_a, wo_b, the indexer's wq_b, the experts) rounded to fp8 blocks as its
    // fp8 path does, or to bf16 as its bf16 path feeds them (ops/act_rounding.h;
    // EngineOptions::activations).
    ActRounding activations = ActRounding::None;
    // A numerics study too: the indexer's queries (after RoPE) and keys (after kv_norm + RoPE, as
    // stored) rounded as a low-precision indexer kernel would read them (ops/indexer_round.h;
    // EngineOptions::indexer_rounding).
    IndexerRounding indexer_rounding = IndexerRounding::None;
};

struct ExpertSlice {
    int part = 0;  // which slice of the expert hidden width this rank holds
    int parts = 1;  // how many slices (the CP size); slice p holds units [D·p/parts, D·(p+1)/parts)
};

// Hidden units of expert slice `s` of a width-`moe_dim` expert.
inline int64_t slice_width(int64_t moe_dim, ExpertSlice s) {
    return moe_dim * (s.part + 1) / s.parts - moe_dim * s.part / s.parts;
}

struct ModelWeights {
    ModelConfig cfg;
    ExpertSlice slice;
    Tensor embed;                                    // [vocab, d_model]
    Tensor head;                                     // [vocab, d_model]
    Tensor norm;                                     // [d_model]
    Tensor hc_head_fn, hc_head_base, hc_head_scale;  // [hc, hc · d_model], [hc], [1]
    std::vector<LayerWeights> layers;

    size_t bytes() const;  // host bytes held: every weight in the table (fp32, tid2eid int64)
};

struct WeightSpec;

// The tensor that weight `spec` fills in `w` (weight_specs order and names, io/weight_specs.h): the
// one map from the table's slots to the CPU backend's fields. An expert's w1 and w3 both map to
// its [w1; w3] tensor (w13), w2 to its w2; nullptr for a routed expert beyond the sized vectors.
Tensor* tensor_slot(ModelWeights& w, const WeightSpec& spec);
Tensor* tensor_slot(LayerWeights& layer, const WeightSpec& spec);  // a weight of that layer

// Single-threaded: every tensor read whole, experts sliced after reading (the simple reference).
ModelWeights load_weights(const Checkpoint& ckpt, ExpertSlice slice = {});

// Which part of the model a load reads: the top-level tensors (embed, head, norm, hc_head) and
// decoder layers [layer_begin, layer_end) (layer_end < 0: to the last). The CUDA backend loads and
// uploads one part at a time, so that host memory holds one layer, not the model.
struct LoadPart {
    bool top = true;
    int layer_begin = 0;
    int layer_end = -1;
    bool has_layer(int i) const { return i >= layer_begin && (layer_end < 0 || i < layer_end); }
};

class Progress;

struct LoadOptions {
    LoadOptions(int threads_ = 1, bool progress_ = false,
                std::optional<size_t> host_memory_ = std::nullopt)
        : threads(threads_), progress(progress_), host_memory(host_memory_) {}
    int threads;    // reader threads (0: all hardware threads)
    bool progress;  // a progress line on stderr (drawn only on a terminal, after 1 s)
    // Host bytes the load may take; nullopt: what host_memory_available() reports (no check
    // where it reports nothing).
    std::optional<size_t> host_memory;
    LoadPart part;            // what to read (default: everything)
    Progress* bar = nullptr;  // when set, the load adds its stored bytes to this line instead
                              // of drawing its own (one line across the parts of a load)
};

// Host bytes that load_rank_weights allocates for ranks `ranks` of a CP group of `cp_size`: every
// dense tensor of `part` once (fp32, tid2eid as int64), and each listed rank's slice of every
// expert in `part`.
size_t rank_weights_host_bytes(const ModelConfig& cfg, int cp_size, const std::vector<int>& ranks,
                               const LoadPart& part = {});
// The host bytes of the largest part when the model is loaded part by part as the CUDA backend
// does (the top-level tensors, then one layer at a time): the most it holds at once.
size_t streamed_load_host_bytes(const ModelConfig& cfg, int cp_size, const std::vector<int>& ranks);
// Stored (checkpoint) bytes that loading `ranks` reads, for a progress line's total.
size_t rank_weights_stored_bytes(const Checkpoint& ck, int cp_size, const std::vector<int>& ranks);

struct LoadStats {
    size_t stored_bytes = 0;  // bytes of the stored tensors read (weights and block scales)
    size_t f32_bytes = 0;     // fp32 bytes produced: dense tensors once, every rank's experts
    double seconds = 0;       // wall clock of load_rank_weights
};

// Every rank's weights for a CP group of `cp_size` ranks, read straight from the checkpoint by a
// pool of `opt.threads`: the dense (non-expert) tensors once, shared by all ranks; rank r's slice
// {r, cp_size} of every routed and shared expert read directly (only the blocks it needs, never
// the full expert). Bit-identical to slice_experts(load_weights(ck), {r, cp_size}). With
// only_ranks (non-empty) only those ranks' expert slices are read and returned, in that order (a
// process under mpirun needs its own rank only). Refused before anything is allocated or read when
// rank_weights_host_bytes exceeds the host memory available (LoadOptions::host_memory). With
// LoadOptions::part only that part is read; the other layers (and top-level tensors) stay empty.
std::vector<ModelWeights> load_rank_weights(const Checkpoint& ck, int cp_size,
                                            const LoadOptions& opt, LoadStats* stats = nullptr,
                                            const std::vector<int>& only_ranks = {});

// The same load in parts, as the CUDA backend uses it: the top-level tensors (part −1), then each
// layer (part i), each read with LoadOptions::part into fresh host tensors, handed to `on_part`
// and dropped before the next part is read; one progress line for the whole load. Returns the
// totals.
LoadStats load_rank_weights_in_parts(
    const Checkpoint& ck, int cp_size, LoadOptions opt, const std::vector<int>& only_ranks,
    const std::function<void(int part, const std::vector<ModelWeights>& ranks)>& on_part);

// A rank's view of fully loaded weights: the same (shared, not copied) attention and head tensors,
// and slice `slice.part` of `slice.parts` of every routed and shared expert's hidden width.
ModelWeights slice_experts(const ModelWeights& full, ExpertSlice slice);

}  // namespace cpfill
