// The GPU prefill's plan (parallel/cuda/gpu_runner.h make_run_plan) on the host: how a batch is
// cut into chunks and sub-batches, and the rows carried between chunks. No GPU needed, so it runs
// in CI; the workspace sizes (CUB asks the device for its sort's scratch) and the chunked runs are
// tested on the GPU (tests/cuda/test_gpu_chunks.cpp).
#ifdef CPFILL_HAVE_CUDA
#include <gtest/gtest.h>

#include <numeric>

#include "io/presets.h"
#include "parallel/cuda/gpu_runner.h"
#include "parallel/cuda/gpu_workspace.h"

namespace cpfill {
namespace {

std::vector<std::vector<int32_t>> requests_of(const std::vector<int64_t>& lengths) {
    std::vector<std::vector<int32_t>> r;
    for (int64_t n : lengths) r.emplace_back(n, 3);
    return r;
}

// Every token of the stream in exactly one chunk, in order; each chunk's sub-batches cover it.
void expect_covers(const cuda::RunPlan& p, int64_t total) {
    int64_t row = 0;
    for (const cuda::ChunkPlan& c : p.chunks) {
        EXPECT_EQ(c.stream_row0, row);
        int64_t in_subs = 0;
        ASSERT_EQ(c.subs.size(), c.row_offset.size());
        for (size_t i = 0; i < c.subs.size(); ++i) {
            EXPECT_EQ(c.row_offset[i], in_subs);
            in_subs += c.subs[i].n_tokens();
        }
        EXPECT_EQ(in_subs, c.batch.n_tokens());
        EXPECT_EQ(c.subs.size(), c.tbo ? 2u : 1u);
        row += c.batch.n_tokens();
    }
    EXPECT_EQ(row, total);
    EXPECT_EQ(p.n_tokens, total);
}

TEST(GpuRunPlan, ChunksCoverTheStreamEachWithItsOwnSplit) {
    const ModelConfig cfg = preset_config("tiny");
    const auto req = requests_of({300, 50, 676});  // 1026 tokens: chunks of 256, the last 2
    const cuda::RunPlan p = cuda::make_run_plan(req, cfg, 1, TboMode::On, 256);
    ASSERT_EQ(p.chunks.size(), 5u);
    EXPECT_EQ(p.chunk, 256);
    EXPECT_TRUE(p.tbo());
    expect_covers(p, 1026);
    // The second chunk continues request 0 (positions 256 … 299), then holds request 1 whole and
    // the start of request 2.
    const Batch& b = p.chunks[1].batch;
    ASSERT_GE(b.segments.size(), 3u);
    EXPECT_EQ(b.segments[0].request, 0);
    EXPECT_EQ(b.segments[0].pos0, 256);
    EXPECT_EQ(b.segments[1].request, 1);
    EXPECT_EQ(b.segments[1].pos0, 0);
    EXPECT_EQ(b.segments[2].request, 2);
    // A chunk of one token is never split.
    const cuda::RunPlan q = cuda::make_run_plan(requests_of({257}), cfg, 1, TboMode::On, 256);
    ASSERT_EQ(q.chunks.size(), 2u);
    EXPECT_FALSE(q.chunks[1].tbo);
    expect_covers(q, 257);
}

TEST(GpuRunPlan, OneChunkIsOnePass) {
    const ModelConfig cfg = preset_config("tiny");
    const auto req = requests_of({100, 20});
    for (int64_t chunk : {0, 120, 4096}) {
        const cuda::RunPlan p = cuda::make_run_plan(req, cfg, 2, TboMode::Off, chunk);
        ASSERT_EQ(p.chunks.size(), 1u) << chunk;
        EXPECT_EQ(p.chunk, 0) << chunk;
        EXPECT_FALSE(p.tbo());
        expect_covers(p, 120);
    }
}

// The carried rows cover what a window completed in the next chunk may pool: CSA its own ratio
// tokens and the ratio before, HCA its own.
TEST(GpuRunPlan, CarriedRowsCoverAWindowAndTheOneBefore) {
    const ModelConfig flash = preset_config("flash-slice");
    EXPECT_EQ(cuda::carry_rows(flash),
              std::max<int64_t>(2 * int64_t{flash.csa_ratio}, flash.hca_ratio));
    ModelConfig wide = flash;
    wide.csa_ratio = 128;
    wide.hca_ratio = 64;
    EXPECT_EQ(cuda::carry_rows(wide), 256);
}

}  // namespace
}  // namespace cpfill
#endif
