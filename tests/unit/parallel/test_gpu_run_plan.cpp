// The GPU prefill's chunk plan on the host: the rows carried between chunks. No GPU needed, so it
// runs in CI; the plan itself is tested in test_run_plan.cpp, the workspace sizes (CUB asks the
// device for its sort's scratch) and the chunked runs on the GPU (tests/cuda/test_gpu_chunks.cpp).
#ifdef CPFILL_HAVE_CUDA
#include <gtest/gtest.h>

#include "io/presets.h"
#include "parallel/cuda/gpu_workspace.h"

namespace cpfill {
namespace {

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
