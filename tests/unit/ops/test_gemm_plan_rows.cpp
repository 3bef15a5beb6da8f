// The GPU GEMM plan classes (ops/gemm_plan_rows.h): each class is named by its top, the classes
// cover every row count without gaps, and they match the documented edges.
#include <gtest/gtest.h>

#include "ops/gemm_plan_rows.h"

namespace cpfill {
namespace {

using ops::gemm_plan_rows;

TEST(GemmPlanRows, DocumentedEdges) {
    EXPECT_EQ(gemm_plan_rows(1), 1);
    EXPECT_EQ(gemm_plan_rows(64), 64);
    EXPECT_EQ(gemm_plan_rows(65), 80);
    EXPECT_EQ(gemm_plan_rows(256), 256);
    EXPECT_EQ(gemm_plan_rows(257), 320);
    EXPECT_EQ(gemm_plan_rows(512), 512);
    EXPECT_EQ(gemm_plan_rows(513), 640);
    EXPECT_EQ(gemm_plan_rows(1281), 1536);
    EXPECT_EQ(gemm_plan_rows(8192), 8192);
}

TEST(GemmPlanRows, EachClassIsNamedByItsTopAndGrowsWithN) {
    int64_t prev = 0;
    for (int64_t n = 1; n <= 1 << 20; ++n) {
        const int64_t top = gemm_plan_rows(n);
        ASSERT_GE(top, n) << n;
        ASSERT_EQ(gemm_plan_rows(top), top) << "class of " << n;
        ASSERT_GE(top, prev) << n;
        ASSERT_LE(top - n, n / 4 + 15) << "class of " << n << " too wide";
        prev = top;
    }
}

}  // namespace
}  // namespace cpfill
