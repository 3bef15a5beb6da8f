// RoPE tables (plain and YaRN, following HF's compute_default / yarn parameter functions) and the
// interleaved rotation.
#include "ops/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"

namespace cpfill::ops {

namespace {

double yarn_correction_dim(double rotations, int dim, double base, double max_pos) {
    return dim * std::log(max_pos / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(const RopeParams& p, int rope_dim) : rope_dim_(rope_dim) {
    CPFILL_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope dim must be even and positive, found {}",
                 rope_dim);
    int half = rope_dim / 2;
    inv_freq_.resize(half);
    std::vector<float> pos_freq(half);
    for (int j = 0; j < half; ++j) {
        float e = static_cast<float>(2 * j) / static_cast<float>(rope_dim);
        pos_freq[j] = static_cast<float>(std::pow(p.theta, static_cast<double>(e)));
    }
    if (!p.yarn) {
        for (int j = 0; j < half; ++j) inv_freq_[j] = 1.0f / pos_freq[j];
        attention_factor_ = 1.0f;
        return;
    }
    double low = yarn_correction_dim(p.beta_fast, rope_dim, p.theta, p.original_max_pos);
    double high = yarn_correction_dim(p.beta_slow, rope_dim, p.theta, p.original_max_pos);
    if (p.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(rope_dim - 1));
    if (low == high) high += 0.001;
    float factor = static_cast<float>(p.factor);
    for (int j = 0; j < half; ++j) {
        float ramp =
            (static_cast<float>(j) - static_cast<float>(low)) / static_cast<float>(high - low);
        ramp = std::min(1.0f, std::max(0.0f, ramp));
        float extrap_factor = 1.0f - ramp;
        float extrap = 1.0f / pos_freq[j];
        float interp = 1.0f / (factor * pos_freq[j]);
        inv_freq_[j] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
    attention_factor_ = static_cast<float>(p.attention_factor);
}

void RopeTable::cos_sin(int64_t pos, float* c, float* s) const {
    for (size_t j = 0; j < inv_freq_.size(); ++j) {
        float angle = inv_freq_[j] * static_cast<float>(pos);
        c[j] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor_;
        s[j] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor_;
    }
}

void apply_rope(const RopeTable& table, float* x, int64_t rows, int64_t ld, int heads, int head_dim,
                const int64_t* pos, bool inverse) {
    const int half = table.rope_dim() / 2;
    std::vector<float> c(half), s(half);
    for (int64_t r = 0; r < rows; ++r) {
        table.cos_sin(pos[r], c.data(), s.data());
        for (int h = 0; h < heads; ++h) {
            float* v = x + r * ld + static_cast<int64_t>(h) * head_dim + head_dim - 2 * half;
            for (int j = 0; j < half; ++j) {
                float sn = inverse ? -s[j] : s[j];
                float a = v[2 * j], b = v[2 * j + 1];
                v[2 * j] = a * c[j] - b * sn;
                v[2 * j + 1] = b * c[j] + a * sn;
            }
        }
    }
}

}  // namespace cpfill::ops
