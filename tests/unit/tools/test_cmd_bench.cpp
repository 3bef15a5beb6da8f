// `cpfill bench` on bad input and on a machine without a usable GPU: one "error:" line naming the
// culprit and exit code 1, or CLI11's usage error and exit code 2. The benchmark itself runs on a
// GPU machine (a benchmark is not a test, docs/conventions.md); the report it prints is tested in
// tests/unit/engine/test_bench_report.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_test_util.h"
#include "runtime/device.h"

namespace cpfill {
namespace {

using Result = test::CliResult;

Result bench(const std::string& args) { return test::run_cli("bench " + args); }

void expect_error(const std::string& args, const std::vector<std::string>& parts) {
    const Result r = bench(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    size_t lines = 0;
    for (size_t p = r.out.find("error:"); p != std::string::npos; p = r.out.find("error:", p + 1))
        ++lines;
    EXPECT_EQ(lines, 1u) << args << "\n" << r.out;
    for (const auto& part : parts)
        EXPECT_NE(r.out.find(part), std::string::npos) << args << ": no \"" << part << "\" in\n"
                                                       << r.out;
}

// Arguments are checked before any GPU is looked for, so these fail the same everywhere.
TEST(CmdBench, BadArgumentsNameTheCulprit) {
    expect_error("--lengths 8q", {"--lengths", "\"8q\"", "k = 1024"});
    expect_error("--lengths 8k,,16k", {"--lengths", "empty item"});
    expect_error("--lengths 0", {"--lengths", "at least 1"});
    expect_error("--lengths 4M", {"--lengths 4M", "1048576 positions"});
    expect_error("--preset nope", {"\"nope\"", "flash-slice"});
    expect_error("--cp 0", {"--cp 0", ">= 1"});
    expect_error("--cp 1,two", {"--cp two"});
    expect_error("--tbo maybe", {"--tbo maybe", "off, on or auto"});
    expect_error("--repeat 0", {"--repeat 0"});
    expect_error("--warmup -1", {"--warmup -1"});
    expect_error("--layers 0", {"--layers 0"});
    expect_error("--weights bf16,fp16", {"--weights fp16", "bf16, fp8 or fp4"});
}

TEST(CmdBench, UnknownOptionIsAUsageError) {
    const Result r = bench("--lenghts 8k");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--lenghts"), std::string::npos) << r.out;
}

TEST(CmdBench, HelpListsTheOptions) {
    const Result r = bench("--help");
    EXPECT_EQ(r.code, 0) << r.out;
    for (const char* opt :
         {"--preset", "--layers", "--lengths", "--cp", "--tbo", "--repeat", "--warmup", "--seed",
          "--json", "--plot", "--no-exposed", "--no-ceilings"})
        EXPECT_NE(r.out.find(opt), std::string::npos) << opt << "\n" << r.out;
}

TEST(CmdBench, WithoutAGpuSaysSo) {
    std::string why;
    if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a GPU is present: the benchmark would run";
    expect_error("--lengths 1k --cp 1 --tbo off", {"no GPU is usable", why});
}

}  // namespace
}  // namespace cpfill
