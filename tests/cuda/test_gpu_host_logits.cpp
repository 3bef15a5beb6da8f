// The CUDA backend's host logits ([S, V] f32 with all_logits) are refused before the run when they
// do not fit into the host memory left, as the CPU backend's are (issue 14.15); the last-position
// logits of the same prompt still fit. Skips without a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "cuda_test_util.h"
#include "engine/prefill_engine.h"

namespace cpfill {
namespace {

const std::string kModel = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_a";

TEST(GpuHostLogits, AllLogitsBeyondHostMemoryAreRefused) {
    CPFILL_SKIP_WITHOUT_GPU();
    EngineOptions eo;
    eo.cuda = true;
    PrefillEngine engine(kModel, eo);  // loaded with the real host memory figure
    const int64_t V = engine.config().vocab_size, S = 300;
    const std::vector<std::vector<int32_t>> requests(1, std::vector<int32_t>(S, 7));
    // Room for the last position's logits, not for all S of them.
    const size_t all_bytes = static_cast<size_t>(S * V) * sizeof(float);
    ASSERT_EQ(::setenv("CPFILL_HOST_MEMORY", std::to_string(all_bytes - 1).c_str(), 1), 0);
    RunOptions opt;
    opt.all_logits = true;
    try {
        engine.run(requests, opt);
        ::unsetenv("CPFILL_HOST_MEMORY");
        FAIL() << "expected out of host memory for " << all_bytes << " bytes of logits";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("out of host memory"), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(all_bytes) + " bytes"), std::string::npos) << m;
        EXPECT_NE(m.find("--all-logits"), std::string::npos) << m;
    }
    opt.all_logits = false;
    const RunResult r = engine.run(requests, opt);
    ::unsetenv("CPFILL_HOST_MEMORY");
    ASSERT_EQ(r.out.logits.size(), 1u);
    EXPECT_EQ(r.out.logits[0].numel(), V);
}

}  // namespace
}  // namespace cpfill
