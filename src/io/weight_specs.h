// The one table of every weight of a DeepSeek-V4 model, derived from a ModelConfig: canonical
// (official release) name, logical shape (as the forward pass uses it, after dequantisation) and
// storage class in the official release (docs/architecture.md §6.2–§6.4). Which tensors exist
// depends on the layer type (compressor on CSA/HCA, indexer on CSA) and on the MoE routing
// (gate.bias on learned layers, gate.tid2eid on hash layers). MTP tensors are not listed.
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

struct WeightSpec {
    std::string name;  // canonical name: embed.weight, layers.3.attn.wq_a.weight, ...
    Shape shape;       // logical shape: [out, in] for linears
    WeightClass cls;
    int layer = -1;   // -1 for the top-level tensors
    int expert = -1;  // routed expert index, -1 otherwise
};

// A routed or shared expert's w1 / w2 / w3: the weights that CP ranks slice instead of replicate.
bool is_expert_weight(const WeightSpec& spec);

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
