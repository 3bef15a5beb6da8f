// The command line's trust checks (issue 14): bad weights and non-finite logits are errors, an
// empty or folder prompt file is an error, output paths are checked before the model is loaded
// (creatable, not an input, room for the known size), a --kv-out folder keeps a manifest and never
// mixes runs, and a failed write leaves no truncated file.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../io/io_test_util.h"
#include "cli_test_util.h"
#include "core/dtype.h"
#include "engine/kv_export.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace cpfill {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using Result = test::CliResult;
using test::run_cli;

const std::string kFixture = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_b";

void copy_model(const TempDir& dir, const std::string& sub = "") {
    if (!sub.empty()) fs::create_directories(dir.file(sub));
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(kFixture + "/" + f, dir.file(sub.empty() ? f : sub + "/" + f));
}

void expect_clean_error(const Result& r, const std::vector<std::string>& parts) {
    EXPECT_EQ(r.code, 1) << r.out;
    size_t lines = 0, pos = 0;
    while ((pos = r.out.find("error:", pos)) != std::string::npos) ++lines, ++pos;
    EXPECT_EQ(lines, 1u) << r.out;
    for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << p << "\n" << r.out;
}

// Rewrites `file` with `edit` applied to one tensor (as an owned copy).
void edit_tensor(const std::string& file, const std::string& name,
                 const std::function<void(Tensor&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    {
        SafetensorsFile f(file);
        ASSERT_TRUE(f.has(name)) << name;
        for (const auto& [n, info] : f.tensors()) tensors.emplace_back(n, f.get(n).clone());
    }
    for (auto& [n, t] : tensors)
        if (n == name) edit(t);
    write_safetensors(file, tensors);
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// --- item 2: non-finite weights and logits ---------------------------------------------------

TEST(CliTrust, NanWeightIsNamedWithItsIndex) {
    TempDir tmp;
    copy_model(tmp);
    edit_tensor(tmp.file("model.safetensors"), "model.hc_head.hc_fn", [](Tensor& t) {
        t.f32()[130] = std::numeric_limits<float>::quiet_NaN();  // [4, 128]: element [1, 2]
    });
    expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2,3"),
                       {"model.hc_head.hc_fn", "[1, 2]", "nan", "expected a finite value"});
}

TEST(CliTrust, NonFiniteLogitsAreAnErrorNotAFirstToken) {
    // Finite weights that overflow: the head's products exceed the fp32 range.
    TempDir tmp;
    copy_model(tmp);
    edit_tensor(tmp.file("model.safetensors"), "head.weight", [](Tensor& t) {
        uint16_t* v = t.data<uint16_t>();                       // bf16 [256, 32]
        for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0x7f7f;  // the largest finite bf16
    });
    const Result r = run_cli("run --model " + tmp.path().string() + " --input-ids 1,2,3");
    expect_clean_error(r, {"request 0", "logits are not finite", "expected finite logits"});
    EXPECT_EQ(r.out.find("tokens, first token"), std::string::npos) << r.out;
}

// --- item 3: empty or folder prompt files ------------------------------------------------------

TEST(CliTrust, EmptyPromptFileIsAnError) {
    TempDir tmp;
    test::write_file(tmp.file("empty.txt"), "");
    expect_clean_error(
        run_cli("run --model " + kFixture + " --prompt-file " + tmp.file("empty.txt")),
        {"empty.txt", "empty"});
}

TEST(CliTrust, FolderAsPromptFileIsAnError) {
    TempDir tmp;
    expect_clean_error(run_cli("run --model " + kFixture + " --prompt-file " + tmp.path().string()),
                       {tmp.path().string(), "a folder"});
}

// --- item 5: an output that is an input ---------------------------------------------------------

TEST(CliTrust, LogitsOutOntoTheModelIsRefused) {
    TempDir tmp;
    copy_model(tmp, "m");
    const std::string model = tmp.file("m/model.safetensors");
    const std::string before = slurp(model);
    // The same file by another name: a symlink and a hard link.
    fs::create_symlink(model, tmp.file("link.safetensors"));
    fs::create_hard_link(model, tmp.file("hard.safetensors"));
    for (const std::string& out :
         {model, tmp.file("link.safetensors"), tmp.file("hard.safetensors"),
          tmp.file("m/../m/model.safetensors")}) {
        expect_clean_error(
            run_cli("run --model " + tmp.file("m") + " --input-ids 1,2 " + "--logits-out " + out),
            {"--logits-out", "is the input", "would be overwritten"});
    }
    EXPECT_EQ(slurp(model), before);
    // The ids file and the prompt file are inputs too.
    test::write_file(tmp.file("ids.txt"), "1 2 3\n");
    expect_clean_error(run_cli("run --model " + tmp.file("m") + " --input-ids-file " +
                               tmp.file("ids.txt") + " --logits-out " + tmp.file("ids.txt")),
                       {"is the input"});
    EXPECT_EQ(slurp(tmp.file("ids.txt")), "1 2 3\n");
    // A new file inside the model folder, or --kv-out the model folder, would join the checkpoint.
    expect_clean_error(run_cli("run --model " + tmp.file("m") + " --input-ids 1,2 --logits-out " +
                               tmp.file("m/new.safetensors")),
                       {"inside the model folder"});
    expect_clean_error(
        run_cli("run --model " + tmp.file("m") + " --input-ids 1,2 --kv-out " + tmp.file("m")),
        {"--kv-out", "is the model folder"});
    EXPECT_FALSE(fs::exists(tmp.file("m/new.safetensors")));
    EXPECT_FALSE(fs::exists(tmp.file("m/request_0.safetensors")));
}

// --- item 7: outputs checked before the model is loaded -----------------------------------------

// A host memory figure too small for the model makes the load fail: an output error seen instead
// proves that the outputs were checked first.
class EnvGuard {
  public:
    EnvGuard(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
    ~EnvGuard() { ::unsetenv(name_); }

  private:
    const char* name_;
};

TEST(CliTrust, OutputsAreCheckedBeforeLoading) {
    TempDir tmp;
    EnvGuard mem("CPFILL_HOST_MEMORY", "1K");
    const std::string base = "run --model " + kFixture + " --input-ids 1,2,3 ";
    expect_clean_error(run_cli(base + "--logits-out " + tmp.file("no/such/dir/l.safetensors")),
                       {"--logits-out", "no/such/dir", "does not exist"});
    expect_clean_error(run_cli(base + "--logits-out " + tmp.path().string()),
                       {"--logits-out", "is a folder"});
    test::write_file(tmp.file("file"), "x");
    expect_clean_error(run_cli(base + "--kv-out " + tmp.file("file")),
                       {"--kv-out", "not a folder"});
    expect_clean_error(run_cli(base + "--kv-out " + tmp.file("file") + "/sub"),
                       {"--kv-out", "not a folder"});
    // With the outputs fine, the load's own memory error comes.
    expect_clean_error(run_cli(base + "--logits-out " + tmp.file("l.safetensors")),
                       {"out of host memory"});
}

TEST(CliTrust, OutputLargerThanTheFileSizeLimitIsRefusedBeforeLoading) {
    TempDir tmp;
    EnvGuard mem("CPFILL_HOST_MEMORY", "1K");
    // 3 positions x 256 logits x 4 bytes = 3 KiB of data + the header; ulimit -f counts 512-byte
    // (dash) or 1024-byte (bash) blocks: 2 blocks are at most 2 KiB.
    const std::string cmd =
        "sh -c 'ulimit -f 2; exec " + std::string(CPFILL_BINARY) + " run --model " + kFixture +
        " --input-ids 1,2,3 --all-logits --logits-out " + tmp.file("l.safetensors") + "' 2>&1";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    expect_clean_error(r, {"--logits-out", "ulimit -f"});
    EXPECT_FALSE(fs::exists(tmp.file("l.safetensors")));
}

// --- item 6: --kv-out into a folder of an earlier run --------------------------------------------

TEST(CliTrust, KvOutFolderKeepsAManifestAndDropsStaleFiles) {
    TempDir tmp;
    test::write_file(tmp.file("two.txt"), "1 2 3 4 5\n6 7 8\n");
    test::write_file(tmp.file("one.txt"), "9 10 11\n");
    const std::string kv = tmp.file("kv");
    const std::string base = "run --model " + kFixture + " --kv-out " + kv + " --input-ids-file ";
    ASSERT_EQ(run_cli(base + tmp.file("two.txt")).code, 0);
    ASSERT_TRUE(fs::exists(kv + "/request_1.safetensors"));
    test::write_file(kv + "/notes.txt", "mine");  // not ours: left alone
    const Result r = run_cli(base + tmp.file("one.txt"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(kv + "/request_0.safetensors"));
    EXPECT_FALSE(fs::exists(kv + "/request_1.safetensors"));  // the earlier run's, named by it
    EXPECT_TRUE(fs::exists(kv + "/notes.txt"));
    const auto m = nlohmann::json::parse(slurp(kv + "/manifest.json"));
    EXPECT_EQ(m["format"], "cpfill-kv-manifest-1");
    EXPECT_EQ(m["complete"], true);
    EXPECT_EQ(m["files"], nlohmann::json::array({"request_0.safetensors"}));
    EXPECT_EQ(m["n_tokens"], nlohmann::json::array({3}));
    SafetensorsFile f(kv + "/request_0.safetensors");
    EXPECT_EQ(f.metadata().at("n_tokens"), "3");
    // Every file in the folder is either named by the manifest or not of our pattern.
    for (const auto& e : fs::directory_iterator(kv)) {
        const std::string name = e.path().filename().string();
        EXPECT_TRUE(name == "manifest.json" || name == "notes.txt" ||
                    name == "request_0.safetensors")
            << name;
    }
}

TEST(CliTrust, KvOutFolderWithUnknownKvFilesIsRefused) {
    TempDir tmp;
    fs::create_directories(tmp.file("kv"));
    test::write_file(tmp.file("kv/request_5.safetensors"), "someone's");
    EnvGuard mem("CPFILL_HOST_MEMORY", "1K");  // refused before the load
    expect_clean_error(
        run_cli("run --model " + kFixture + " --input-ids 1,2 --kv-out " + tmp.file("kv")),
        {"--kv-out", "request_5.safetensors", "is not named by"});
    EXPECT_EQ(slurp(tmp.file("kv/request_5.safetensors")), "someone's");
    test::write_file(tmp.file("kv/manifest.json"), "{\"files\": [\"../../etc/passwd\"]}");
    expect_clean_error(
        run_cli("run --model " + kFixture + " --input-ids 1,2 --kv-out " + tmp.file("kv")),
        {"manifest.json", "is not a cpfill KV manifest"});
}

// The space planned for a KV file is exactly its tensors' bytes (plus a header allowance).
TEST(CliTrust, KvStateBytesMatchTheWrittenTensors) {
    TempDir tmp;
    const ModelConfig cfg = load_model_config(kFixture + "/config.json");
    for (const int n : {3, 5, 130, 270}) {
        std::string ids;
        for (int i = 0; i < n; ++i) ids += std::to_string(1 + i % 200) + " ";
        test::write_file(tmp.file("ids.txt"), ids + "\n");
        const std::string kv = tmp.file("kv" + std::to_string(n));
        ASSERT_EQ(run_cli("run --model " + kFixture + " --kv-out " + kv + " --input-ids-file " +
                          tmp.file("ids.txt"))
                      .code,
                  0);
        SafetensorsFile f(kv + "/request_0.safetensors");
        size_t bytes = 0;
        for (const auto& [name, info] : f.tensors()) bytes += info.end - info.begin;
        EXPECT_EQ(kv_state_bytes(cfg, n), bytes) << n << " tokens";
    }
}

// --- item 8: gen-model checks first and leaves no partial checkpoint ----------------------------

// `sh -c 'ulimit -f BLOCKS; exec cpfill ARGS'`: runs with a file size limit.
Result run_cli_limited(int blocks, const std::string& args) {
    const std::string cmd = "sh -c 'ulimit -f " + std::to_string(blocks) + "; exec " +
                            std::string(CPFILL_BINARY) + " " + args + "' 2>&1";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

TEST(CliTrust, GenModelImpossibleConfigIsAClearErrorBeforeWriting) {
    TempDir tmp;
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixture + "/config.json"));
    cfg["vocab_size"] = 2147483647;  // embed [2^31 - 1, 2^20]: 2^51 values, 8 PiB of fp32
    cfg["hidden_size"] = 1 << 20;
    std::ofstream(tmp.file("huge.json")) << cfg.dump(2);
    const Result r =
        run_cli("gen-model --config " + tmp.file("huge.json") + " --out " + tmp.file("m"));
    expect_clean_error(r, {"out of host memory"});
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(tmp.file("m"))) << "a partial checkpoint was left";
    EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{"huge.json"});
    // A tensor beyond any memory: named with its shape.
    cfg["hidden_size"] = 2147483647;  // 2^62 values
    std::ofstream(tmp.file("huge.json")) << cfg.dump(2);
    expect_clean_error(
        run_cli("gen-model --config " + tmp.file("huge.json") + " --out " + tmp.file("m")),
        {"embed.weight", "too large"});
    EXPECT_FALSE(fs::exists(tmp.file("m")));
}

TEST(CliTrust, GenModelThatCannotFinishLeavesNoPartialCheckpoint) {
    TempDir tmp;
    // ~100 KiB of files allowed: the tiny preset's shard does not fit.
    const Result r = run_cli_limited(200, "gen-model --preset tiny --out " + tmp.file("m"));
    expect_clean_error(r, {"--out", "ulimit -f"});
    EXPECT_FALSE(fs::exists(tmp.file("m")));
    EXPECT_EQ(listing(tmp.path()), std::vector<std::string>{});
    // Over an earlier checkpoint: it stays whole.
    ASSERT_EQ(run_cli("gen-model --preset tiny --seed 1 --out " + tmp.file("m")).code, 0);
    const std::vector<std::string> before = listing(tmp.file("m"));
    const std::string weights = slurp(tmp.file("m/model.safetensors"));
    expect_clean_error(run_cli_limited(200, "gen-model --preset tiny --seed 2 --dtype bf16 --out " +
                                                tmp.file("m")),
                       {"ulimit -f"});
    EXPECT_EQ(listing(tmp.file("m")), before);
    EXPECT_EQ(slurp(tmp.file("m/model.safetensors")), weights);
    EXPECT_EQ(run_cli("run --model " + tmp.file("m") + " --input-ids 1,2,3").code, 0);
}

}  // namespace
}  // namespace cpfill
