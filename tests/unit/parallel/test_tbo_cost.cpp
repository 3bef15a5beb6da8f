// The CUDA backend's `--tbo auto` cost model (parallel/cp_prefill.h): hidden collective time grows
// with the prompt, the split's expert-GEMM overhead does not, so TBO is chosen only past a
// crossover, never at CP = 1 and never with fewer than C tokens per sub-batch.
#include <gtest/gtest.h>

#include "io/presets.h"
#include "parallel/cp_prefill.h"

namespace cpfill {
namespace {

TEST(GpuTboCost, OffAtCp1AndForTinyBatches) {
    const ModelConfig cfg = preset_config("flash-slice");
    EXPECT_FALSE(gpu_tbo_pays(cfg, 1 << 20, 1));
    EXPECT_DOUBLE_EQ(gpu_tbo_gain_seconds(cfg, 1 << 20, 1), 0.0);
    TboCostModel free_split{250, 0.0};
    EXPECT_FALSE(gpu_tbo_pays(cfg, 3, 2, free_split));  // one token per sub-batch, cp = 2
    EXPECT_TRUE(gpu_tbo_pays(cfg, 4, 2, free_split));
}

TEST(GpuTboCost, GainGrowsWithLengthAndCrossesOver) {
    const ModelConfig cfg = preset_config("flash-slice");
    double prev = gpu_tbo_gain_seconds(cfg, 1024, 2);
    for (int64_t t = 2048; t <= (int64_t{1} << 21); t *= 2) {
        const double g = gpu_tbo_gain_seconds(cfg, t, 2);
        EXPECT_GT(g, prev) << t;
        prev = g;
    }
    // Measured (docs/performance-notes.md, second table): on 2×H200 TBO did not pay at 8k–64k
    // and was 1.5% faster at 128k; on 4×H200 it was 1.6% slower at 64k, 2.1% faster at 128k.
    EXPECT_FALSE(gpu_tbo_pays(cfg, 64 * 1024, 2));
    EXPECT_TRUE(gpu_tbo_pays(cfg, 128 * 1024, 2));
    EXPECT_TRUE(gpu_tbo_pays(cfg, 1 << 20, 2));
    EXPECT_FALSE(gpu_tbo_pays(cfg, 32 * 1024, 4));
    EXPECT_FALSE(gpu_tbo_pays(cfg, 64 * 1024, 4));
    EXPECT_TRUE(gpu_tbo_pays(cfg, 128 * 1024, 4));
    // Slower links hide more: the crossover moves down.
    TboCostModel slow{25, 12e-6};
    EXPECT_TRUE(gpu_tbo_pays(cfg, 64 * 1024, 2, slow));
}

}  // namespace
}  // namespace cpfill
