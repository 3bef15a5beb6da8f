// scripts/check-gpu-skips.sh, which scripts/gpu-check.sh runs on the GPU tests' log: on a machine
// with GPUs a skipped GPU test fails the check, unless it needs more GPUs than the machine has.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "../io/io_test_util.h"

namespace cpfill {
namespace {

const std::string kScript = std::string(CPFILL_TEST_DATA_DIR) + "/../../scripts/check-gpu-skips.sh";

// A gtest log: one passed test, plus a skipped test per reason given.
std::string gtest_log(const std::vector<std::string>& skip_reasons) {
    std::string log = "[==========] Running tests.\n";
    for (size_t i = 0; i < skip_reasons.size(); ++i) {
        const std::string name = "Gpu.Case" + std::to_string(i);
        log += "[ RUN      ] " + name + "\n/src/tests/cuda/t.cpp:23: Skipped\n" + skip_reasons[i] +
               "\n\n[  SKIPPED ] " + name + " (0 ms)\n";
    }
    log += "[ RUN      ] Gpu.Runs\n[       OK ] Gpu.Runs (3 ms)\n";
    log += "[==========] tests ran. (5 ms total)\n[  PASSED  ] 1 test.\n";
    return log;
}

// The script's exit status on `log` for a machine with `gpus` GPUs.
int check(const std::string& log, int gpus) {
    test::TempDir tmp;
    test::write_file(tmp.file("cuda-tests.log"), log);
    const std::string cmd =
        "bash " + kScript + " " + tmp.file("cuda-tests.log") + " " + std::to_string(gpus);
    const int status = std::system((cmd + " > /dev/null").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(GpuCheckSkips, NoSkipPasses) { EXPECT_EQ(check(gtest_log({}), 1), 0); }

TEST(GpuCheckSkips, ASkipWithGpusPresentFails) {
    EXPECT_EQ(check(gtest_log({"no CUDA device: cudaGetDeviceCount: CUDA driver version is "
                               "insufficient for CUDA runtime version"}),
                    1),
              1);
    EXPECT_EQ(check(gtest_log({"mpirun not installed"}), 2), 1);
}

TEST(GpuCheckSkips, NeedingMoreGpusThanPresentIsAllowed) {
    EXPECT_EQ(check(gtest_log({"needs 2 GPUs"}), 1), 0);
    EXPECT_EQ(check(gtest_log({"needs 2 GPUs"}), 2), 1);  // there are 2: it had to run
}

TEST(GpuCheckSkips, NoPassedTestFails) {
    EXPECT_EQ(check("[==========] 0 tests ran.\n[  PASSED  ] 0 tests.\n", 1), 1);
    EXPECT_EQ(check("Segmentation fault\n", 1), 1);  // a crash before the summary
}

}  // namespace
}  // namespace cpfill
