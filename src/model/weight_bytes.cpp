// Byte counts of a rank's weights, from the weight table.
#include "model/weight_bytes.h"

#include "core/error.h"

namespace cpfill {

int64_t rank_numel(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice) {
    const int64_t n = shape_numel(spec.shape);
    if (spec.shard == CpShard::Replicated) return n;
    // Each expert tensor is moe_dim × d_model (w1 / w3 rows, w2 columns): the slice is exactly
    // width / moe_dim of it.
    return n / cfg.moe_dim * slice_width(cfg.moe_dim, slice);
}

DType gpu_dtype(const WeightSpec& spec) {
    if (spec.cls == WeightClass::I64) return DType::I64;
    return is_gemm_weight(spec) ? DType::BF16 : DType::F32;
}

ExpertSlice widest_slice(int64_t moe_dim, int cp) {
    ExpertSlice best{0, cp};
    for (int r = 1; r < cp; ++r)
        if (slice_width(moe_dim, {r, cp}) > slice_width(moe_dim, best)) best = {r, cp};
    return best;
}

size_t gpu_rank_weight_bytes(const ModelConfig& cfg, ExpertSlice slice) {
    CPFILL_CHECK(slice.parts >= 1 && slice.part >= 0 && slice.part < slice.parts &&
                     slice.parts <= cfg.moe_dim,
                 "expert slice {} of {}: expected 0 <= slice < parts <= {} (moe_intermediate_size)",
                 slice.part, slice.parts, cfg.moe_dim);
    size_t bytes = 2 * static_cast<size_t>(cfg.rope_dim / 2) * 4;  // RoPE inv_freq tables
    for (const WeightSpec& spec : weight_specs(cfg))
        bytes += static_cast<size_t>(rank_numel(spec, cfg, slice)) * dtype_size(gpu_dtype(spec));
    return bytes;
}

size_t gpu_weight_bytes(const ModelConfig& cfg, int cp) {
    CPFILL_CHECK(cp >= 1 && cp <= cfg.moe_dim, "--cp {}: expected 1 to {} (moe_intermediate_size)",
                 cp, cfg.moe_dim);
    return gpu_rank_weight_bytes(cfg, widest_slice(cfg.moe_dim, cp));
}

}  // namespace cpfill
