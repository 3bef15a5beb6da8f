// write_random_checkpoint stopped halfway (here by its progress callback throwing, as any failure
// of a later shard would) leaves the target as it was — absent, or holding the earlier checkpoint
// — and no staging folder; the progress callback counts up to the planned total.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

RandomCheckpointOptions sharded(size_t fail_after_bytes) {
    RandomCheckpointOptions o;
    o.max_shard_bytes = 1 << 20;  // several shards
    o.on_progress = [fail_after_bytes](size_t done, size_t) {
        if (done > fail_after_bytes) throw Error("stopped for the test");
    };
    return o;
}

TEST(RandomCheckpointFailure, NewTargetIsNotCreated) {
    TempDir tmp;
    EXPECT_THROW(write_random_checkpoint(preset_config("tiny"), tmp.file("m"), sharded(3 << 20)),
                 Error);
    EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{});
}

TEST(RandomCheckpointFailure, EarlierCheckpointStaysWhole) {
    TempDir tmp;
    RandomCheckpointOptions first;
    first.max_shard_bytes = 1 << 20;
    write_random_checkpoint(preset_config("tiny"), tmp.file("m"), first);
    test::write_file(tmp.file("m/tokenizer.json"), "{}");  // not ours: kept
    const std::vector<std::string> before = listing(tmp.file("m"));
    ASSERT_GT(before.size(), 3u);
    const std::string index = slurp(tmp.file("m/model.safetensors.index.json"));
    RandomCheckpointOptions o = sharded(3 << 20);
    o.seed = 9;
    EXPECT_THROW(write_random_checkpoint(preset_config("tiny"), tmp.file("m"), o), Error);
    EXPECT_EQ(listing(tmp.file("m")), before);
    EXPECT_EQ(slurp(tmp.file("m/model.safetensors.index.json")), index);
    // Finished, the new one replaces it; the foreign file stays.
    o.on_progress = nullptr;
    o.max_shard_bytes = size_t{4} << 30;
    write_random_checkpoint(preset_config("tiny"), tmp.file("m"), o);
    EXPECT_EQ(listing(tmp.file("m")),
              (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
}

TEST(RandomCheckpointFailure, ProgressCountsToTheTotal) {
    TempDir tmp;
    size_t last = 0, total = 0, calls = 0;
    RandomCheckpointOptions o;
    o.on_progress = [&](size_t done, size_t t) {
        EXPECT_GE(done, last);
        last = done;
        total = t;
        ++calls;
    };
    write_random_checkpoint(preset_config("tiny"), tmp.file("m"), o);
    EXPECT_GT(calls, 10u);
    EXPECT_EQ(last, total);
    // The total is the stored bytes: the file is that plus its header.
    const size_t file = fs::file_size(tmp.file("m/model.safetensors"));
    EXPECT_GT(file, total);
    EXPECT_LT(file, total + (1 << 20));
}

}  // namespace
}  // namespace cpfill
