// Checkpoint: a model folder (config.json + safetensors, one file or sharded with an index) read
// by canonical (official) tensor name, whatever naming it was written with — upstream, HF
// save_pretrained (hf-saved) or the HF module tree (hf-module, stacked routed experts) — and
// whatever format: f32, bf16, f16, fp8 e4m3 with E8M0 128×128 block scales, packed fp4 e2m1
// experts with E8M0 1×32 scales (docs/design.md §7, docs/architecture.md §6). Tensors are
// dequantised to fp32 on request, checked against the weight table of the config; errors name the
// canonical tensor, the stored name and file, the expected and the found shape/dtype.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "io/weight_specs.h"

namespace cpfill {

// How one canonical weight is stored (for inspect and memory planning).
struct StoredWeight {
    std::string name;        // stored tensor (the stacked one for hf-module experts)
    std::string scale_name;  // "" when not block-quantised
    DType dtype = DType::F32;
    Shape shape;      // stored shape (stacked [E, ...] for hf-module experts)
    int expert = -1;  // slice of a stacked tensor
    StackPart part = StackPart::Whole;
    size_t bytes = 0;  // bytes of this weight alone (its slice of a stacked tensor), scales incl.
};

class Checkpoint {
  public:
    // `dir`: a folder with config.json and the safetensors files.
    explicit Checkpoint(const std::string& dir);

    const std::string& dir() const { return dir_; }
    const ModelConfig& config() const { return cfg_; }
    const WeightSpecTable& specs() const { return specs_; }
    const SafetensorsSet& files() const { return *files_; }
    std::string naming() const { return std::string(naming_name(naming_)); }  // "upstream", ...
    Naming naming_kind() const { return naming_; }

    bool has(const std::string& canonical) const;             // stored (or tied head)
    StoredWeight stored(const std::string& canonical) const;  // throws if missing or misshaped
    // The whole weight dequantised to F32 with its logical shape.
    Tensor get_f32(const std::string& canonical) const;
    // Rows [row_begin, row_end) of dimension 0, dequantised (only the needed blocks are read).
    Tensor get_f32_rows(const std::string& canonical, int64_t row_begin, int64_t row_end) const;
    // Columns [col_begin, col_end) of a 2-D weight, dequantised (only the needed blocks are read:
    // the 128×128 tiles of fp8, the 1×32 blocks of fp4).
    Tensor get_f32_cols(const std::string& canonical, int64_t col_begin, int64_t col_end) const;
    // Rows [r0, r1) × columns [c0, c1) of a weight seen as 2-D ([shape[0], rest]; a 1-D weight
    // has one column), dequantised into `dst`: f32 [r1 - r0, c1 - c0], row-major. The building
    // block of the getters above and of the parallel loader (model/weights.h); thread-safe.
    void read_f32_block(const std::string& canonical, int64_t r0, int64_t r1, int64_t c0,
                        int64_t c1, float* dst) const;
    // An integer table (tid2eid) as I64; accepts I64 or I32 storage; values checked in [0, E).
    Tensor get_i64(const std::string& canonical) const;

    // Asks the OS to start reading the stored rows [r0, r1) of a weight from disk (the whole
    // row range, whatever columns will be read) and returns at once: a loader calls it for the
    // reads it will do next so that the disk works while it dequantises.
    void prefetch(const std::string& canonical, int64_t r0, int64_t r1) const;

    // Checks that every weight of the config is present with the right shape and a usable dtype
    // (reads headers only). Throws on the first problem.
    void validate() const;
    // Stored tensors that no weight of the config uses (MTP blocks, stray tensors), sorted.
    std::vector<std::string> unused_tensors() const;

  private:
    struct Located;  // a resolved stored weight (see checkpoint.cpp)
    Located locate(const WeightSpec& spec) const;
    void read_block(const WeightSpec& spec, const Located& loc, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1, float* dst) const;

    std::string dir_;
    ModelConfig cfg_;
    WeightSpecTable specs_;
    std::unique_ptr<SafetensorsSet> files_;
    Naming naming_ = Naming::Upstream;
};

}  // namespace cpfill
