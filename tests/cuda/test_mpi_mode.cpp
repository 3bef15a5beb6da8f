// The multi-process mode: `mpirun -np 2 cpfill run --device cuda --cp 2` (one process per GPU,
// NCCL id broadcast over MPI) gives the same logits as the threaded mode (one process, two GPU
// threads). Skips without two GPUs or without mpirun.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../golden/golden_util.h"
#include "cuda_test_util.h"
#include "io/safetensors.h"

namespace cpfill {
namespace {

int sh(const std::string& cmd) { return std::system(cmd.c_str()); }

// -np 2, and -np 4 and 8 where that many GPUs are visible.
TEST(MpiMode, EqualsThreadedMode) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int gpus = cuda_device_count(nullptr);
    if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs";
    if (sh("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not installed";
    const std::string model = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_a";
    const auto dir = std::filesystem::temp_directory_path() / "cpfill_mpi_test";
    std::filesystem::create_directories(dir);
    const std::string ids = model + "/reference.safetensors";
    for (int C : {2, 4, 8}) {
        if (C > gpus) break;
        const std::string a = (dir / fmt::format("threads{}.safetensors", C)).string();
        const std::string b = (dir / fmt::format("mpi{}.safetensors", C)).string();
        const std::string args = fmt::format(
            "run --model {} --input-ids-file {} --device cuda --cp {} --all-logits --logits-out",
            model, ids, C);
        ASSERT_EQ(sh(fmt::format("{} {} {}", CPFILL_BINARY, args, a)), 0);
        ASSERT_EQ(sh(fmt::format(
                      "mpirun --allow-run-as-root --oversubscribe -np {} -x NCCL_NVLS_ENABLE=0 "
                      "{} {} {}",
                      C, CPFILL_BINARY, args, b)),
                  0);
        SafetensorsFile fa(a), fb(b);
        EXPECT_TRUE(testing::close(fmt::format("mpirun -np {} vs threads logits", C),
                                   fb.get("logits"), fa.get("logits"), 1e-3));
    }
}

TEST(MpiMode, WrongCpIsAnError) {
    CPFILL_SKIP_WITHOUT_GPU();
    if (cuda_device_count(nullptr) < 2) GTEST_SKIP() << "needs 2 GPUs";
    if (sh("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not installed";
    const std::string model = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_a";
    // --cp 1 under 2 processes: every rank refuses, the job ends with a non-zero status.
    const int rc =
        sh(fmt::format("mpirun --allow-run-as-root --oversubscribe -np 2 {} run --model {} "
                       "--input-ids 1,2,3 --device cuda --cp 1 2> /dev/null",
                       CPFILL_BINARY, model));
    EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace cpfill
