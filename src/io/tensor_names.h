// One table of tensor names across the three namings a DeepSeek-V4 checkpoint can use
// (docs/architecture.md §6.1, §8):
//  * upstream  — the official release: embed.weight, layers.N.attn.wq_a.weight, ... (canonical);
//  * hf-saved  — what transformers 5.17 save_pretrained writes: model.embed_tokens.weight,
//                head.weight, model.hc_head.hc_fn, model.layers.N.attn.norm.weight (the kv norm),
//                model.layers.N.ffn.experts.E.w1.weight, ...;
//  * hf-module — the HF module tree: model.layers.N.self_attn.q_a_proj.weight, lm_head.weight,
//                routed experts stacked as mlp.experts.gate_up_proj [E, 2I, D] (w1 rows, then w3
//                rows) and mlp.experts.down_proj [E, D, I].
// Block scales: upstream `X.scale` for `X.weight`, HF `X.weight_scale_inv`; a stacked HF
// parameter P has `P_scale_inv`.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpfill {

enum class Naming { Upstream, HfSaved, HfModule };

std::string_view naming_name(Naming n);  // "upstream", "hf-saved", "hf-module"
std::optional<Naming> parse_naming(std::string_view s);

// Which part of a stacked HF-module expert tensor holds a canonical expert weight.
enum class StackPart { Whole, FirstHalf, SecondHalf };

// Where a canonical tensor is stored under a naming.
struct StoredName {
    std::string name;                     // stored name (the stacked tensor for hf-module experts)
    std::vector<std::string> alternates;  // other spellings seen in the wild, tried after `name`
    int expert = -1;                      // >= 0: slice [expert] of a stacked [E, ...] tensor
    StackPart part = StackPart::Whole;    // rows of that slice: gate_up_proj = [w1; w3]
};

// Throws naming the tensor if `canonical` is not a V4 tensor name.
StoredName stored_name(const std::string& canonical, Naming naming);
// Inverse for unstacked names; nullopt for an unknown name or a stacked expert tensor.
std::optional<std::string> canonical_name(const std::string& stored, Naming naming);
// Candidate names of the block-scale tensor of a stored weight, preferred first.
std::vector<std::string> scale_names(const std::string& stored_weight, Naming naming);
// The name the writer uses for the scale of a stored weight.
std::string scale_name(const std::string& stored_weight, Naming naming);

// The naming of a checkpoint from the names it holds; nullopt when none matches.
std::optional<Naming> detect_naming(const std::vector<std::string>& names);

}  // namespace cpfill
