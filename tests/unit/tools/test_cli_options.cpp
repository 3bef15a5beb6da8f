// The command line's shared helpers (tools/cli_options.h): nearest-name suggestions and the error
// line with or without the source location.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/error.h"
#include "tools/cli_options.h"

namespace cpfill::tools {
namespace {

TEST(CliOptions, NearestNameSuggestsCloseNamesOnly) {
    const std::vector<std::string> opts = {"--input-ids", "--input-ids-file", "--model", "--cp"};
    EXPECT_EQ(nearest_name("--input-id", opts), "--input-ids");
    EXPECT_EQ(nearest_name("--input-ids-fil", opts), "--input-ids-file");
    EXPECT_EQ(nearest_name("--modle", opts), "--model");  // a swap of neighbours counts once
    EXPECT_EQ(nearest_name("--frobnicate", opts), "");
    const std::vector<std::string> subs = {"run", "gen-model", "inspect", "demo", "bench"};
    EXPECT_EQ(nearest_name("rnu", subs), "run");
    EXPECT_EQ(nearest_name("gen-modle", subs), "gen-model");
    EXPECT_EQ(nearest_name("xyz", subs), "");
}

TEST(CliOptions, ErrorLineHasTheLocationOnlyWhenDebugging) {
    try {
        CPFILL_CHECK(false, "token {} out of range", 7);
        FAIL() << "CPFILL_CHECK did not throw";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "token 7 out of range");
        EXPECT_NE(e.location().find("test_cli_options.cpp:"), std::string::npos) << e.location();
        ASSERT_EQ(::unsetenv("CPFILL_DEBUG"), 0);
        EXPECT_EQ(error_line(e), "error: token 7 out of range");
        ASSERT_EQ(::setenv("CPFILL_DEBUG", "0", 1), 0);
        EXPECT_EQ(error_line(e), "error: token 7 out of range");
        ASSERT_EQ(::setenv("CPFILL_DEBUG", "1", 1), 0);
        EXPECT_EQ(error_line(e), "error: token 7 out of range [" + e.location() + "]");
        ASSERT_EQ(::unsetenv("CPFILL_DEBUG"), 0);
    }
}

}  // namespace
}  // namespace cpfill::tools
