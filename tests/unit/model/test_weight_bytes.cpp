// The byte counts of model/weight_bytes.h against what the loader really produces: for every rank
// of several CP sizes, the table's per-rank element counts equal the loaded tensors' sizes, and the
// GPU byte count equals those sizes at the GPU dtypes. The widest slice is the widest.
#include <gtest/gtest.h>

#include "../io/io_test_util.h"
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

}  // namespace
}  // namespace cpfill
