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

// The stored bytes of one weight seen as a 2-D slab [rows, cols] (logical columns; packed fp4
// holds two per byte), for loaders that move stored bytes and decode them elsewhere (the GPU
// upload: model/cuda/stored_upload.h). Row r starts at w + r · row_bytes. For block-quantised
// weights the scale of element (r, c) is s[(r + s_row_off) / row_block][c / col_block] (rows of
// s_cols scales of sdtype: E8M0 bytes, or F32 powers of two); s_row_off is the w1 half that the
// w3 half of a stacked gate_up_proj skips in the scale tensor the two share.
struct StoredSlab {
    enum class Kind { Float, Fp8, Fp4 };
    Kind kind = Kind::Float;
    DType dtype = DType::F32;  // Float: F32, BF16 or F16; Fp8: F8_E4M3; Fp4: I8 or U8
    int64_t rows = 0, cols = 0, row_bytes = 0;
    const uint8_t* w = nullptr;
    const uint8_t* s = nullptr;  // null when not block-quantised
    DType sdtype = DType::F8_E8M0;
    int64_t s_cols = 0, s_row_off = 0, row_block = 1, col_block = 1;
    Tensor w_view, s_view;  // the stored tensors the pointers point into (kept alive)
    int64_t scale_row_bytes() const { return s_cols * static_cast<int64_t>(dtype_size(sdtype)); }
    // The scale rows [first, last) that slab rows [r0, r1) use (empty without scales).
    std::pair<int64_t, int64_t> scale_rows(int64_t r0, int64_t r1) const {
        if (!s || r0 >= r1) return {0, 0};
        return {(r0 + s_row_off) / row_block, (r1 - 1 + s_row_off) / row_block + 1};
    }
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
    // Where weight `canonical` is stored, as a slab (float or quantised weights; not tid2eid). A
    // loader that decodes the bytes itself and finds a bad element reads that element with
    // read_f32_block, which throws the error the host loader gives (non-finite value, bad scale).
    StoredSlab slab(const std::string& canonical) const;
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
