// The output path checks (io/output_paths.h): creatable files and folders (with no probe file
// left), free space summed per filesystem, the file size limit, and outputs that are inputs by
// device and inode (a hard link, a symlink).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "io/output_paths.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

namespace fs = std::filesystem;
using test::entries;
using test::FileSizeLimit;
using test::TempDir;

TEST(OutputPaths, FileChecks) {
    TempDir tmp;
    test::expect_error([&] { check_output_file(tmp.file("no/x.safetensors"), "--out"); },
                       {"--out", "does not exist"});
    test::expect_error([&] { check_output_file(tmp.path().string(), "--out"); }, {"is a folder"});
    check_output_file(tmp.file("x.safetensors"), "--out");
    EXPECT_EQ(entries(tmp), std::vector<std::string>{}) << "the probe file was left";
    test::write_file(tmp.file("f"), "");
    test::expect_error([&] { check_output_folder(tmp.file("f/sub"), "--dir"); },
                       {"--dir", "is not a folder"});
    check_output_folder(tmp.file("new/deeper"), "--dir");
}

TEST(OutputPaths, SpaceAndFileSizeLimit) {
    TempDir tmp;
    const auto free = free_disk_bytes(tmp.path().string());
    ASSERT_TRUE(free.has_value());
    check_output_space({{"--out", tmp.file("a"), 1024}});
    test::expect_error(
        [&] {
            check_output_space({{"--out", tmp.file("a"), *free + (1u << 30)}});
        },
        {"--out", "are free"});
    // Two outputs on one filesystem add up.
    test::expect_error(
        [&] {
            check_output_space({{"--a", tmp.file("a"), *free / 2 + (1u << 20)},
                                {"--b", tmp.file("sub/b"), *free / 2 + (1u << 20)}});
        },
        {"--b", "are free"});
    FileSizeLimit limit(4096);
    test::expect_error(
        [&] {
            check_output_space({{"--out", tmp.file("a"), 8192}});
        },
        {"--out", "8192 bytes", "ulimit -f"});
}

TEST(OutputPaths, NotAnInputByInode) {
    TempDir tmp;
    test::write_file(tmp.file("in"), "x");
    fs::create_hard_link(tmp.file("in"), tmp.file("hard"));
    fs::create_symlink(tmp.file("in"), tmp.file("soft"));
    const std::vector<FileId> inputs = {*file_id(tmp.file("in"))};
    for (const char* out : {"in", "hard", "soft"})
        test::expect_error([&] { check_not_an_input(tmp.file(out), "--out", inputs); },
                           {"--out", "is the input"});
    check_not_an_input(tmp.file("other"), "--out", inputs);
    test::write_file(tmp.file("other"), "y");
    check_not_an_input(tmp.file("other"), "--out", inputs);
}

}  // namespace
}  // namespace cpfill
