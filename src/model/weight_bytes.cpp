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

GpuWeightFormat parse_gpu_weight_format(const std::string& s) {
    if (s == "bf16") return GpuWeightFormat::Bf16;
    if (s == "fp8") return GpuWeightFormat::Fp8;
    if (s == "fp4") return GpuWeightFormat::Fp4;
    CPFILL_FAIL("--weights {}: expected auto, bf16, fp8 or fp4", s);
}

std::string_view gpu_weight_format_name(GpuWeightFormat f) {
    return f == GpuWeightFormat::Fp8 ? "fp8" : f == GpuWeightFormat::Fp4 ? "fp4" : "bf16";
}

GpuIndexer parse_gpu_indexer(const std::string& s) {
    if (s == "auto") return GpuIndexer::Auto;
    if (s == "bf16") return GpuIndexer::Bf16;
    if (s == "fp8") return GpuIndexer::Fp8;
    CPFILL_FAIL("--indexer {}: expected auto, bf16 or fp8", s);
}

std::string_view gpu_indexer_name(GpuIndexer i) {
    return i == GpuIndexer::Fp8 ? "fp8" : i == GpuIndexer::Bf16 ? "bf16" : "auto";
}

bool gpu_indexer_fp8(GpuIndexer choice, GpuWeightFormat format, bool sm90) {
    CPFILL_CHECK(choice != GpuIndexer::Fp8 || sm90,
                 "--indexer fp8 needs a GPU of compute capability 9.0 (Hopper); this one runs the "
                 "bf16 indexer (--indexer bf16 or auto)");
    if (choice == GpuIndexer::Auto) return format != GpuWeightFormat::Bf16 && sm90;
    return choice == GpuIndexer::Fp8;
}

bool is_fp8(GpuStorage s) { return s == GpuStorage::Fp8Tile || s == GpuStorage::Fp8Row; }

ops::Fp8Blocks fp8_blocks(GpuStorage s) {
    CPFILL_CHECK(is_fp8(s), "fp8_blocks: not an fp8 storage");
    return s == GpuStorage::Fp8Tile ? ops::Fp8Blocks::Tile128 : ops::Fp8Blocks::Row128;
}

GpuStorage gpu_storage(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice,
                       GpuWeightFormat format) {
    if (spec.cls == WeightClass::I64) return GpuStorage::I64;
    if (!is_gemm_weight(spec)) return GpuStorage::F32;
    if (format == GpuWeightFormat::Bf16) return GpuStorage::Bf16;
    const int64_t width = slice_width(cfg.moe_dim, slice);
    if (spec.cls == WeightClass::Fp4Expert) {
        if (cfg.d_model % 128 != 0 || width % 128 != 0) return GpuStorage::Bf16;
        return format == GpuWeightFormat::Fp4 ? GpuStorage::Fp4 : GpuStorage::Fp8Row;
    }
    if (spec.cls != WeightClass::Fp8Linear) return GpuStorage::Bf16;
    const int64_t in = spec.shard == CpShard::HiddenCols ? width : spec.shape[1];
    // The shared expert's slice also in whole row tiles: w1 and w3 are one [2 · width, d_model]
    // matrix on the GPU, and its tiles must be the two matrices' tiles.
    if (in % 128 != 0 || (spec.shard != CpShard::Replicated && width % 128 != 0))
        return GpuStorage::Bf16;
    if (spec.slot == WeightSlot::WoA && cfg.o_rank % 128 != 0) return GpuStorage::Bf16;
    return GpuStorage::Fp8Tile;
}

DType gpu_dtype(const WeightSpec& spec) {
    if (spec.cls == WeightClass::I64) return DType::I64;
    return is_gemm_weight(spec) ? DType::BF16 : DType::F32;
}

size_t gpu_spec_bytes(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice,
                      GpuWeightFormat format) {
    const GpuStorage st = gpu_storage(spec, cfg, slice, format);
    const auto n = static_cast<size_t>(rank_numel(spec, cfg, slice));
    switch (st) {
        case GpuStorage::F32:
            return n * 4;
        case GpuStorage::I64:
            return n * 8;
        case GpuStorage::Bf16:
            return n * 2;
        case GpuStorage::Fp4:
            return n / 2 + n / 32;
        default:
            break;
    }
    // One matrix [rows, cols] on the rank: the slice's rows of w1 / w3, columns of w2.
    const int64_t width = slice_width(cfg.moe_dim, slice);
    const int64_t rows = spec.shard == CpShard::HiddenRows ? width : spec.shape[0];
    const int64_t cols = spec.shard == CpShard::HiddenCols ? width : spec.shape[1];
    return n + static_cast<size_t>(ops::fp8_scale_count(rows, cols, fp8_blocks(st))) * 4;
}

ExpertSlice widest_slice(int64_t moe_dim, int cp) {
    ExpertSlice best{0, cp};
    for (int r = 1; r < cp; ++r)
        if (slice_width(moe_dim, {r, cp}) > slice_width(moe_dim, best)) best = {r, cp};
    return best;
}

size_t gpu_rank_weight_bytes(const ModelConfig& cfg, ExpertSlice slice, GpuWeightFormat format) {
    CPFILL_CHECK(slice.parts >= 1 && slice.part >= 0 && slice.part < slice.parts &&
                     slice.parts <= cfg.moe_dim,
                 "expert slice {} of {}: expected 0 <= slice < parts <= {} (moe_intermediate_size)",
                 slice.part, slice.parts, cfg.moe_dim);
    size_t bytes = 2 * static_cast<size_t>(cfg.rope_dim / 2) * 4;  // RoPE inv_freq tables
    for (const WeightSpec& spec : weight_specs(cfg))
        bytes += gpu_spec_bytes(spec, cfg, slice, format);
    return bytes;
}

size_t gpu_weight_bytes(const ModelConfig& cfg, int cp, GpuWeightFormat format) {
    CPFILL_CHECK(cp >= 1 && cp <= cfg.moe_dim, "--cp {}: expected 1 to {} (moe_intermediate_size)",
                 cp, cfg.moe_dim);
    return gpu_rank_weight_bytes(cfg, widest_slice(cfg.moe_dim, cp), format);
}

}  // namespace cpfill
