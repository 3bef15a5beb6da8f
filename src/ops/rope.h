// Interleaved partial RoPE (docs/architecture.md §3.0): the trailing rope_dim channels of each head
// rotate in consecutive pairs (2j, 2j+1) by angle p·ω_j. Frequencies as HF computes them (fp32),
// plain or YaRN (§3.0, "compress" table), with cos/sin multiplied by attention_factor.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace cpfill::ops {

class RopeTable {
  public:
    RopeTable() = default;
    RopeTable(const RopeParams& params, int rope_dim);
    int rope_dim() const { return rope_dim_; }
    const std::vector<float>& inv_freq() const { return inv_freq_; }  // [rope_dim / 2]
    // cos/sin of pair j at position p (fp32 angle as in HF: float(inv_freq) · float(p)).
    void cos_sin(int64_t pos, float* cos_out, float* sin_out) const;

  private:
    int rope_dim_ = 0;
    float attention_factor_ = 1.0f;
    std::vector<float> inv_freq_;
};

// Rotates, for each row r, the last rope_dim channels of each of `heads` blocks of `head_dim`
// channels of x[r] (row stride `ld`) at position pos[r]; inverse = rotate by −pos (de-rotation).
void apply_rope(const RopeTable& table, float* x, int64_t rows, int64_t ld, int heads, int head_dim,
                const int64_t* pos, bool inverse);

}  // namespace cpfill::ops
