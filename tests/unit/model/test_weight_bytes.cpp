// The byte counts of model/weight_bytes.h against what the loader really produces: for every rank
// of several CP sizes, the table's per-rank element counts equal the loaded tensors' sizes, and the
// GPU byte count equals those sizes at the GPU dtypes. The widest slice is the widest. The
// --indexer rule.
#include <gtest/gtest.h>

#include "../io/io_test_util.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "model/weight_bytes.h"

namespace cpfill {
namespace {

TEST(WeightBytes, TableCountsEqualTheLoadedTensors) {
    ModelConfig cfg = preset_config("tiny");
    cfg.moe_dim = 300;  // slices of uneven width at C = 8
    test::TempDir dir;
    RandomCheckpointOptions o;
    o.seed = 3;
    o.threads = 2;
    write_random_checkpoint(cfg, dir.path().string(), o);
    const Checkpoint ck(dir.path().string());
    for (int C : {1, 3, 8}) {
        std::vector<ModelWeights> ranks = load_rank_weights(ck, C, {2, false});
        for (int r = 0; r < C; ++r) {
            SCOPED_TRACE(fmt::format("rank {} of {}", r, C));
            size_t gpu = 2 * static_cast<size_t>(cfg.rope_dim / 2) * 4;  // the RoPE tables
            for (const WeightSpec& spec : ck.specs().all()) {
                const Tensor* t = tensor_slot(ranks[r], spec);
                ASSERT_TRUE(t && t->defined()) << spec.name;
                // An expert's w1 and w3 share [w1; w3]: each is half of it.
                const bool half = spec.slot == WeightSlot::W1 || spec.slot == WeightSlot::W3;
                const int64_t numel = t->numel() / (half ? 2 : 1);
                EXPECT_EQ(rank_numel(spec, cfg, {r, C}), numel) << spec.name;
                gpu += static_cast<size_t>(numel) * dtype_size(gpu_dtype(spec));
            }
            EXPECT_EQ(gpu_rank_weight_bytes(cfg, {r, C}), gpu);
        }
    }
}

TEST(WeightBytes, WidestSliceAndItsBytes) {
    ModelConfig cfg = preset_config("tiny");
    cfg.moe_dim = 300;  // C = 8: widths 37, 38, 37, 38, ...
    const ExpertSlice w = widest_slice(cfg.moe_dim, 8);
    for (int r = 0; r < 8; ++r)
        EXPECT_LE(slice_width(cfg.moe_dim, {r, 8}), slice_width(cfg.moe_dim, w)) << r;
    EXPECT_EQ(slice_width(cfg.moe_dim, w), 38);
    EXPECT_EQ(gpu_weight_bytes(cfg, 8), gpu_rank_weight_bytes(cfg, w));
    EXPECT_GT(gpu_weight_bytes(cfg, 8), gpu_rank_weight_bytes(cfg, {0, 8}));
    EXPECT_THROW(gpu_weight_bytes(cfg, 301), Error);
    EXPECT_THROW(gpu_weight_bytes(cfg, 0), Error);
}

// --weights fp8: the release's fp8 linears as e4m3 + 128×128 tile scales, fp4 experts as e4m3 +
// (row, 128 columns) scales, where the rank's GEMM input width allows; everything else as before.
TEST(WeightBytes, Fp8StorageAndItsBytes) {
    ModelConfig cfg = preset_config("tiny");  // d_model 256, q_rank 128, 8 × 512 heads, moe 128
    const WeightSpecTable t(cfg);
    const auto st = [&](const std::string& name, ExpertSlice s = {0, 1}) {
        return gpu_storage(t.at(name), cfg, s, GpuWeightFormat::Fp8);
    };
    EXPECT_EQ(st("layers.1.attn.wq_b.weight"), GpuStorage::Fp8Tile);
    EXPECT_EQ(st("layers.1.attn.wo_a.weight"), GpuStorage::Fp8Tile);
    EXPECT_EQ(st("layers.1.ffn.shared_experts.w2.weight"), GpuStorage::Fp8Tile);
    EXPECT_EQ(st("layers.1.ffn.experts.3.w1.weight"), GpuStorage::Fp8Row);
    EXPECT_EQ(st("layers.1.attn.compressor.wkv.weight"), GpuStorage::Bf16);  // bf16 in the release
    EXPECT_EQ(st("layers.1.ffn.gate.weight"), GpuStorage::Bf16);
    EXPECT_EQ(st("embed.weight"), GpuStorage::Bf16);
    EXPECT_EQ(st("layers.1.attn_norm.weight"), GpuStorage::F32);
    // At --cp 2 the experts' slices are 64 wide: not whole 128-blocks, so bf16 (shared and routed).
    EXPECT_EQ(st("layers.1.ffn.experts.3.w2.weight", {1, 2}), GpuStorage::Bf16);
    EXPECT_EQ(st("layers.1.ffn.shared_experts.w1.weight", {1, 2}), GpuStorage::Bf16);
    EXPECT_EQ(gpu_storage(t.at("layers.1.attn.wq_b.weight"), cfg, {0, 1}, GpuWeightFormat::Bf16),
              GpuStorage::Bf16);
    // wq_b [4096, 128]: 1 byte per value + 32 row tiles × 4 (1 column tile padded to 4) scales.
    EXPECT_EQ(gpu_spec_bytes(t.at("layers.1.attn.wq_b.weight"), cfg, {0, 1}, GpuWeightFormat::Fp8),
              size_t{4096 * 128 + 32 * 4 * 4});
    // An expert's w1 [128, 256]: 128 rows × 2 column blocks of scales.
    EXPECT_EQ(
        gpu_spec_bytes(t.at("layers.1.ffn.experts.3.w1.weight"), cfg, {0, 1}, GpuWeightFormat::Fp8),
        size_t{128 * 256 + 128 * 2 * 4});
    EXPECT_LT(gpu_weight_bytes(cfg, 1, GpuWeightFormat::Fp8), gpu_weight_bytes(cfg, 1));
    cfg.o_rank = 64;  // wo_a's per-group rows are not whole tiles
    EXPECT_EQ(gpu_storage(WeightSpecTable(cfg).at("layers.1.attn.wo_a.weight"), cfg, {0, 1},
                          GpuWeightFormat::Fp8),
              GpuStorage::Bf16);
    // fp4: the routed experts packed (half a byte per value + one E8M0 byte per 32), the
    // linears as with fp8.
    cfg = preset_config("tiny");
    const WeightSpecTable t4(cfg);
    const WeightSpec& w1 = t4.at("layers.1.ffn.experts.3.w1.weight");
    EXPECT_EQ(gpu_storage(w1, cfg, {0, 1}, GpuWeightFormat::Fp4), GpuStorage::Fp4);
    EXPECT_EQ(gpu_spec_bytes(w1, cfg, {0, 1}, GpuWeightFormat::Fp4),
              size_t{128 * 256 / 2 + 128 * 256 / 32});
    EXPECT_EQ(gpu_storage(t4.at("layers.1.attn.wq_b.weight"), cfg, {0, 1}, GpuWeightFormat::Fp4),
              GpuStorage::Fp8Tile);
    EXPECT_LT(gpu_weight_bytes(cfg, 1, GpuWeightFormat::Fp4),
              gpu_weight_bytes(cfg, 1, GpuWeightFormat::Fp8));
    EXPECT_EQ(parse_gpu_weight_format("fp8"), GpuWeightFormat::Fp8);
    EXPECT_THROW(parse_gpu_weight_format("auto"), Error);
}

}  // namespace
}  // namespace cpfill

namespace cpfill {
namespace {

// --indexer: auto follows the weights and the GPU; bf16 and fp8 are what they say; fp8 where the
// GPU has no fp8 kernel is an error naming the flag; the names parse back.
TEST(GpuIndexerChoice, AutoFollowsTheWeightsAndTheGpu) {
    using F = GpuWeightFormat;
    using I = GpuIndexer;
    EXPECT_FALSE(gpu_indexer_fp8(I::Auto, F::Bf16, true));
    EXPECT_TRUE(gpu_indexer_fp8(I::Auto, F::Fp8, true));
    EXPECT_TRUE(gpu_indexer_fp8(I::Auto, F::Fp4, true));
    EXPECT_FALSE(gpu_indexer_fp8(I::Auto, F::Fp8, false));  // not Hopper: bf16
    EXPECT_FALSE(gpu_indexer_fp8(I::Bf16, F::Fp8, true));
    EXPECT_TRUE(gpu_indexer_fp8(I::Fp8, F::Bf16, true));
    EXPECT_FALSE(gpu_indexer_fp8(I::Bf16, F::Bf16, false));
    try {
        gpu_indexer_fp8(I::Fp8, F::Fp8, false);
        FAIL() << "fp8 without the kernel was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--indexer fp8"), std::string::npos) << e.what();
    }
    for (I i : {I::Auto, I::Bf16, I::Fp8})
        EXPECT_EQ(parse_gpu_indexer(std::string(gpu_indexer_name(i))), i);
    EXPECT_THROW(parse_gpu_indexer("fp4"), Error);
}

}  // namespace
}  // namespace cpfill
