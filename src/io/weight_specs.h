// The one table of every weight of a DeepSeek-V4 model, derived from a ModelConfig: canonical
// (official release) name, logical shape (as the forward pass uses it, after dequantisation),
// storage class in the official release (docs/architecture.md §6.2–§6.4), the field it fills in a
// backend's weights (slot), how CP ranks hold it (shard) and the distribution random weights draw
// from (init). Which tensors exist depends on the layer type (compressor on CSA/HCA, indexer on
// CSA) and on the MoE routing (gate.bias on learned layers, gate.tid2eid on hash layers). MTP
// tensors are not listed. Everything that walks a model's weights walks this table: the
// checkpoint's shape checks, the CPU load (model/weights.cpp), the GPU upload and random weights
// (model/cuda/gpu_weights.cu), the byte counts (model/weight_bytes.h), inspect and gen-model
// (docs/fp8.md, "One weight table").
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"

namespace cpfill {

// How the official release stores a weight.
enum class WeightClass {
    Fp8Linear,  // F8_E4M3 [out, in] + F8_E8M0 .scale [ceil(out/128), ceil(in/128)]
    Fp4Expert,  // routed expert: I8 [out, in/2] packed e2m1 + F8_E8M0 .scale [out, ceil(in/32)]
    BF16,       // embed, head, norms, gate.weight, compressor/indexer projections
    F32,        // hc_*, attn_sink, ape, gate.bias
    I64,        // gate.tid2eid
};
std::string_view weight_class_name(WeightClass c);  // "fp8", "fp4", "bf16", "f32", "i64"

// The field a weight fills in a backend's weights (ModelWeights / LayerWeights on the CPU,
// GpuWeights / GpuLayer on the GPU): each backend maps a slot to its storage in one place. The
// compressor slots name the layer's KV compressor; the Idx* slots the CSA indexer's. W1 / W2 / W3
// are an expert's SwiGLU matrices: of routed expert `expert`, or of the shared expert (expert −1).
enum class WeightSlot : uint8_t {
    Embed,
    Norm,
    Head,
    HcHeadFn,
    HcHeadBase,
    HcHeadScale,  // top level
    HcAttnFn,
    HcAttnBase,
    HcAttnScale,
    HcFfnFn,
    HcFfnBase,
    HcFfnScale,
    AttnNorm,
    FfnNorm,
    Sink,
    WqA,
    QNorm,
    WqB,
    Wkv,
    KvNorm,
    WoA,
    WoB,
    CompWkv,
    CompWgate,
    CompApe,
    CompNorm,
    IdxWqB,
    IdxWeightsProj,
    IdxCompWkv,
    IdxCompWgate,
    IdxCompApe,
    IdxCompNorm,
    Gate,
    GateBias,
    Tid2eid,
    W1,
    W2,
    W3,
};

// How the ranks of a CP group hold a weight (docs/parallel.md): attention, norms, router and head
// replicated; every expert (routed and shared) sliced over its hidden width, rank r of C holding
// units [moe_dim·r/C, moe_dim·(r+1)/C) (slice_width in model/weights.h): rows of w1 / w3, columns
// of w2.
enum class CpShard : uint8_t { Replicated, HiddenRows, HiddenCols };

// Random weights (gen-model, bench) draw each value as mean + std · N(0, 1), or a uniform of the
// same mean and deviation.
struct WeightInit {
    double mean = 0.0, std = 1.0;
};

struct WeightSpec {
    std::string name;  // canonical name: embed.weight, layers.3.attn.wq_a.weight, ...
    Shape shape;       // logical shape: [out, in] for linears
    WeightClass cls;
    int layer = -1;   // -1 for the top-level tensors
    int expert = -1;  // routed expert index, -1 otherwise (also for the shared expert)
    WeightSlot slot = WeightSlot::Embed;
    CpShard shard = CpShard::Replicated;
    WeightInit init;
};

// A routed or shared expert's w1 / w2 / w3: the weights that CP ranks slice instead of replicate.
bool is_expert_weight(const WeightSpec& spec);
// A matrix that multiplies activations in a GEMM (the linears, embed, head, router gate): what the
// GPU holds in bf16 (or fp8); every other weight (norms, mHC, sinks, position biases, router
// bias) stays f32 there, tid2eid int64.
bool is_gemm_weight(const WeightSpec& spec);
// The canonical name of an expert's SwiGLU matrix (slot W1, W2 or W3) in layer `layer`: routed
// expert `expert`'s, or the shared expert's for expert −1 ("layers.3.ffn.experts.7.w2.weight",
// "layers.3.ffn.shared_experts.w1.weight"). The table names its experts so.
std::string expert_weight_name(int layer, int expert, WeightSlot slot);

// Every weight in a fixed order: embed, then per layer (hc, norms, attention, compressor, indexer,
// gate, shared expert, routed experts), then norm, head, hc_head.
std::vector<WeightSpec> weight_specs(const ModelConfig& cfg);
// The weights of one decoder layer only (same order as in weight_specs).
std::vector<WeightSpec> layer_weight_specs(const ModelConfig& cfg, int layer);

// weight_specs() indexed by name.
class WeightSpecTable {
  public:
    explicit WeightSpecTable(const ModelConfig& cfg);
    const std::vector<WeightSpec>& all() const { return specs_; }
    const WeightSpec* find(const std::string& canonical) const;  // nullptr if not a weight here
    const WeightSpec& at(const std::string& canonical) const;    // throws naming it

  private:
    std::vector<WeightSpec> specs_;
    std::unordered_map<std::string, size_t> index_;
};

}  // namespace cpfill
