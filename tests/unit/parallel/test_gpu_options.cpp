// The names of the GPU backend's choices that the CPU build knows too (parallel/gpu_prefill.h):
// --collectives.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {
namespace {

TEST(GpuCollectivesNames, RoundTripAndRefusal) {
    for (GpuCollectives c : {GpuCollectives::Nccl, GpuCollectives::Ce})
        EXPECT_EQ(parse_gpu_collectives(gpu_collectives_name(c)), c);
    EXPECT_STREQ(gpu_collectives_name(GpuCollectives::Ce), "ce");
    try {
        (void)parse_gpu_collectives("mpi");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--collectives mpi: expected nccl"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace cpfill
