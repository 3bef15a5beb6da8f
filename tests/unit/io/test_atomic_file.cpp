// AtomicFile and the safetensors writer on failure: a write that fails halfway (here: the file
// size limit, as a full disk would) leaves no truncated file, keeps an existing file's content
// and leaves no temporary file behind.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

namespace fs = std::filesystem;
using test::entries;
using test::FileSizeLimit;
using test::TempDir;

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::pair<std::string, Tensor>> big_tensors() {
    Tensor t = Tensor::zeros(DType::F32, {64, 1024});  // 256 KiB
    return {{"x", t}};
}

TEST(AtomicFile, FailedWriteLeavesNoFile) {
    TempDir tmp;
    const std::string path = tmp.file("out.safetensors");
    {
        FileSizeLimit limit(64 * 1024);
        EXPECT_THROW(write_safetensors(path, big_tensors()), Error);
    }
    EXPECT_FALSE(fs::exists(path));
    EXPECT_EQ(entries(tmp), std::vector<std::string>{}) << "a temporary file was left";
}

TEST(AtomicFile, FailedWriteKeepsTheOldFile) {
    TempDir tmp;
    const std::string path = tmp.file("out.safetensors");
    test::write_file(path, "the earlier run's logits");
    {
        FileSizeLimit limit(64 * 1024);
        test::expect_error([&] { write_safetensors(path, big_tensors()); },
                           {"out.safetensors", "writing failed"});
    }
    EXPECT_EQ(slurp(path), "the earlier run's logits");
    EXPECT_EQ(entries(tmp), std::vector<std::string>{"out.safetensors"});
    // Without the limit the same write replaces it.
    write_safetensors(path, big_tensors());
    SafetensorsFile f(path);
    EXPECT_EQ(f.get("x").numel(), 64 * 1024);
    EXPECT_EQ(entries(tmp), std::vector<std::string>{"out.safetensors"});
}

TEST(AtomicFile, NotCommittedRemovesTheTemporary) {
    TempDir tmp;
    {
        AtomicFile f(tmp.file("a.txt"));
        f.write("abc", 3);
        EXPECT_TRUE(fs::exists(f.temp_path()));
    }
    EXPECT_EQ(entries(tmp), std::vector<std::string>{});
    write_file_atomically(tmp.file("a.txt"), "abc");
    EXPECT_EQ(slurp(tmp.file("a.txt")), "abc");
    EXPECT_EQ(entries(tmp), std::vector<std::string>{"a.txt"});
}

}  // namespace
}  // namespace cpfill
