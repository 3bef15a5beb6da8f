// SafetensorsSet and write_safetensors_sharded: a single file, an indexed folder, a plain folder,
// and each way an index can disagree with its files.
#include <cstring>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::expect_error;
using test::TempDir;
using test::write_file;

// F32 [n] filled with start, start+1, ...: 4n bytes.
Tensor iota(int64_t n, float start) {
    Tensor t = Tensor::empty(DType::F32, {n});
    for (int64_t i = 0; i < n; ++i) t.f32()[i] = start + static_cast<float>(i);
    return t;
}

std::vector<std::pair<std::string, Tensor>> five_tensors() {
    return {{"embed.weight", iota(8, 0)},  // 32 bytes each
            {"layers.0.w", iota(8, 100)},
            {"layers.1.w", iota(8, 200)},
            {"layers.2.w", iota(8, 300)},
            {"head.weight", iota(8, 400)}};
}

void expect_all_present(const SafetensorsSet& set,
                        const std::vector<std::pair<std::string, Tensor>>& tensors) {
    EXPECT_EQ(set.names().size(), tensors.size());
    for (const auto& [name, t] : tensors) {
        ASSERT_TRUE(set.has(name)) << name;
        EXPECT_EQ(set.info(name).shape, t.shape()) << name;
        Tensor got = set.get(name);
        ASSERT_EQ(got.nbytes(), t.nbytes()) << name;
        EXPECT_EQ(std::memcmp(got.raw(), t.raw(), t.nbytes()), 0) << name;
    }
}

TEST(SafetensorsSet, SingleFilePath) {
    TempDir dir;
    const std::string path = dir.file("one.safetensors");
    write_safetensors(path, five_tensors());
    SafetensorsSet set(path);
    expect_all_present(set, five_tensors());
    const std::vector<std::string> sorted = {"embed.weight", "head.weight", "layers.0.w",
                                             "layers.1.w", "layers.2.w"};
    EXPECT_EQ(set.names(), sorted);
    expect_error([&] { set.info("nope"); }, {path, "'nope'"});
    expect_error([&] { set.get("nope"); }, {path, "'nope'"});
}

TEST(SafetensorsSet, ShardedFolderWithIndex) {
    TempDir dir;
    write_safetensors_sharded(dir.path().string(), five_tensors(), 64);  // two tensors per shard
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model-00001-of-00003.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model-00003-of-00003.safetensors"));
    SafetensorsSet set(dir.path().string());
    expect_all_present(set, five_tensors());
    EXPECT_NE(set.info("embed.weight").file.find("model-00001-of-00003"), std::string::npos);
    EXPECT_NE(set.info("head.weight").file.find("model-00003-of-00003"), std::string::npos);
}

TEST(SafetensorsSet, ShardedWriterWritesOneFileWhenItFits) {
    TempDir dir;
    write_safetensors_sharded(dir.path().string(), five_tensors(), 1 << 20);
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model.safetensors"));
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
    expect_all_present(SafetensorsSet(dir.path().string()), five_tensors());
}

TEST(SafetensorsSet, ShardedWriterGivesAnOversizedTensorItsOwnShard) {
    TempDir dir;
    write_safetensors_sharded(dir.path().string(), {{"a", iota(2, 0)}, {"big", iota(64, 0)}}, 16);
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model-00002-of-00002.safetensors"));
    expect_all_present(SafetensorsSet(dir.path().string()),
                       {{"a", iota(2, 0)}, {"big", iota(64, 0)}});
}

TEST(SafetensorsSet, FolderWithoutIndexReadsEveryFile) {
    TempDir dir;
    write_safetensors(dir.file("a.safetensors"), {{"x", iota(2, 0)}});
    write_safetensors(dir.file("b.safetensors"), {{"y", iota(3, 5)}});
    write_file(dir.file("notes.txt"), "not a checkpoint");
    expect_all_present(SafetensorsSet(dir.path().string()), {{"x", iota(2, 0)}, {"y", iota(3, 5)}});
}

TEST(SafetensorsSet, FolderWithoutIndexRejectsATensorInTwoFiles) {
    TempDir dir;
    write_safetensors(dir.file("a.safetensors"), {{"x", iota(2, 0)}});
    write_safetensors(dir.file("b.safetensors"), {{"x", iota(2, 0)}});
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {"'x'", "a.safetensors", "b.safetensors"});
}

TEST(SafetensorsSet, EmptyFolderAndMissingPath) {
    TempDir dir;
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {dir.path().string(), "*.safetensors"});
    expect_error([&] { SafetensorsSet set(dir.file("absent")); }, {"absent", "no such"});
}

// A folder with an index over shard files a.safetensors {x, y} and b.safetensors {z}.
void write_indexed(const TempDir& dir, const std::string& weight_map) {
    write_safetensors(dir.file("a.safetensors"), {{"x", iota(2, 0)}, {"y", iota(2, 2)}});
    write_safetensors(dir.file("b.safetensors"), {{"z", iota(2, 4)}});
    write_file(dir.file("model.safetensors.index.json"),
               R"({"metadata": {"total_size": 24}, "weight_map": )" + weight_map + "}");
}

TEST(SafetensorsSet, HandWrittenIndexIsRead) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"})");
    expect_all_present(SafetensorsSet(dir.path().string()),
                       {{"x", iota(2, 0)}, {"y", iota(2, 2)}, {"z", iota(2, 4)}});
}

TEST(SafetensorsSet, IndexNamingAMissingFile) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors", "y": "a.safetensors", "z": "c.safetensors"})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {"model.safetensors.index.json", "'z'", "c.safetensors", "does not exist"});
}

TEST(SafetensorsSet, IndexNamingAMissingTensor) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {"model.safetensors.index.json", "'y'", "b.safetensors", "does not hold it"});
}

TEST(SafetensorsSet, FileHoldingATensorTheIndexOmits) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors", "z": "b.safetensors"})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {"a.safetensors", "'y'", "no file"});
}

TEST(SafetensorsSet, MalformedIndex) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors",)");
    expect_error([&] { SafetensorsSet set(dir.path().string()); },
                 {"model.safetensors.index.json", "not valid JSON"});
    write_file(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); }, {"\"weight_map\""});
    write_indexed(dir, R"({"x": 3})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); }, {"weight_map[\"x\"]", "number"});
    write_indexed(dir, R"({"x": "../a.safetensors"})");
    expect_error([&] { SafetensorsSet set(dir.path().string()); }, {"inside the folder"});
}

TEST(SafetensorsSet, MalformedShardIsReportedByItsPath) {
    TempDir dir;
    write_indexed(dir, R"({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"})");
    write_file(dir.file("b.safetensors"), "short");
    expect_error([&] { SafetensorsSet set(dir.path().string()); }, {"b.safetensors", "truncated"});
}

}  // namespace
}  // namespace cpfill
