// The cpfill binary on good and bad input: `run` reproduces a golden fixture's logits from the
// command line, and every kind of bad input ends in exactly one "error:" line naming the culprit
// and a non-zero exit code, never a crash.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../io/io_test_util.h"
#include "cli_test_util.h"
#include "io/safetensors.h"

namespace cpfill {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

using Result = test::CliResult;
using test::run_cli;

const std::string kFixture = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_b";

// Copies the fixture model (config.json, model.safetensors) into a temp folder.
void copy_model(const TempDir& dir) {
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(kFixture + "/" + f, dir.file(f));
}

// Expects a clean failure: exit code 1, one "error:" line containing every part.
void expect_clean_error(const Result& r, const std::vector<std::string>& parts) {
    EXPECT_EQ(r.code, 1) << r.out;
    size_t lines = 0, pos = 0;
    while ((pos = r.out.find("error:", pos)) != std::string::npos) ++lines, ++pos;
    EXPECT_EQ(lines, 1u) << r.out;
    for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << p << "\n" << r.out;
}

// Rewrites model.safetensors with `edit` applied to the tensor list.
void edit_tensors(const TempDir& dir,
                  const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    {
        SafetensorsFile f(dir.file("model.safetensors"));
        for (const auto& [name, info] : f.tensors())
            tensors.emplace_back(name, f.get(name).clone());
    }
    edit(tensors);
    write_safetensors(dir.file("model.safetensors"), tensors);
}

TEST(Cli, RunReproducesFixtureLogits) {
    TempDir tmp;
    // Request 1 of the fixture as a text file; all-position logits out.
    SafetensorsFile ref(kFixture + "/reference.safetensors");
    Tensor ids = ref.get("input_ids_1");
    {
        std::ofstream ids_file(tmp.file("ids.txt"));
        for (int64_t i = 0; i < ids.numel(); ++i) ids_file << ids.data<int64_t>()[i] << " ";
    }
    Result r = run_cli("run --model " + kFixture + " --input-ids-file " + tmp.file("ids.txt") +
                       " --all-logits --logits-out " + tmp.file("logits.safetensors"));
    ASSERT_EQ(r.code, 0) << r.out;
    SafetensorsFile out(tmp.file("logits.safetensors"));
    Tensor mine = out.get("logits"), expected = ref.get("logits_1");
    ASSERT_EQ(mine.shape(), expected.shape());
    double max_err = 0, ref_max = 0;
    for (int64_t i = 0; i < mine.numel(); ++i) {
        max_err = std::max(max_err, double(std::abs(mine.f32()[i] - expected.f32()[i])));
        ref_max = std::max(ref_max, double(std::abs(expected.f32()[i])));
    }
    EXPECT_LE(max_err / ref_max, 1e-4);
    EXPECT_NE(r.out.find("first token"), std::string::npos) << r.out;
}

TEST(Cli, GenInspectRunRoundTrip) {
    TempDir tmp;
    Result g = run_cli("gen-model --preset tiny --out " + tmp.file("m") +
                       " --names upstream --dtype fp8 --experts fp4 --seed 3");
    ASSERT_EQ(g.code, 0) << g.out;
    Result i = run_cli("inspect --model " + tmp.file("m"));
    ASSERT_EQ(i.code, 0) << i.out;
    EXPECT_NE(i.out.find("F8_E4M3"), std::string::npos) << i.out;
    Result i2 = run_cli("inspect --model " + tmp.file("m") + " --cp 2");
    ASSERT_EQ(i2.code, 0) << i2.out;
    EXPECT_NE(i2.out.find("host memory to load with --cp 2: CPU backend"), std::string::npos)
        << i2.out;
    EXPECT_NE(i2.out.find("per process under mpirun"), std::string::npos) << i2.out;
    // The GPU's weights per rank in each format: auto means fp4 experts for this checkpoint, and
    // fp4 experts take less than fp8, fp8 less than bf16 (numbers of model/weight_bytes.h).
    EXPECT_NE(i.out.find("--weights auto: fp4"), std::string::npos) << i.out;
    EXPECT_NE(i.out.find("--cp 1: bf16"), std::string::npos) << i.out;
    Result r = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6,7,8,9");
    EXPECT_EQ(r.code, 0) << r.out;
    // --weights is for the GPUs: the CPU backend refuses anything but auto, naming why.
    Result w = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6 --weights fp8");
    EXPECT_EQ(w.code, 1) << w.out;
    EXPECT_NE(w.out.find("--weights fp8: the CPU backend computes in fp32"), std::string::npos)
        << w.out;
    // So is --indexer; an unknown value is a usage error naming the choices.
    Result x = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6 --indexer fp8");
    EXPECT_EQ(x.code, 1) << x.out;
    EXPECT_NE(x.out.find("--indexer fp8: the CPU backend scores the indexer in fp32"),
              std::string::npos)
        << x.out;
    Result y = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6 --indexer fp4");
    EXPECT_NE(y.code, 0) << y.out;
    EXPECT_NE(y.out.find("--indexer"), std::string::npos) << y.out;
    // And --collectives: the copy engines are the GPUs'.
    Result c = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6 --collectives ce");
    EXPECT_EQ(c.code, 1) << c.out;
    EXPECT_NE(c.out.find("--collectives ce: the CPU backend's ranks exchange through memory"),
              std::string::npos)
        << c.out;
    Result d = run_cli("run --model " + tmp.file("m") + " --input-ids 5,6 --collectives mpi");
    EXPECT_NE(d.code, 0) << d.out;
    EXPECT_NE(d.out.find("--collectives"), std::string::npos) << d.out;
}

TEST(Cli, InspectPresetNeedsNoCheckpoint) {
    Result r = run_cli("inspect --preset flash --cp 2");
    ASSERT_EQ(r.code, 0) << r.out;
    // "--cp 2: bf16 X GiB, fp8 Y GiB, fp8 + fp4 experts Z GiB": X > Y > Z, and V4-Flash in the
    // release's formats fits an H200 (139 GiB usable) at --cp 2 (docs/fp8.md).
    const size_t at = r.out.find("--cp 2: bf16 ");
    ASSERT_NE(at, std::string::npos) << r.out;
    double bf16 = 0, fp8 = 0, fp4 = 0;
    ASSERT_EQ(std::sscanf(r.out.c_str() + at,
                          "--cp 2: bf16 %lf GiB, fp8 %lf GiB, fp8 + fp4 experts %lf GiB", &bf16,
                          &fp8, &fp4),
              3)
        << r.out;
    EXPECT_GT(bf16, fp8);
    EXPECT_GT(fp8, fp4);
    EXPECT_LT(fp4, 139.0);
    EXPECT_GT(fp8, 139.0);  // with fp8 experts it does not
    Result none = run_cli("inspect");
    EXPECT_EQ(none.code, 1) << none.out;
    EXPECT_NE(none.out.find("--model DIR (a checkpoint) or --preset NAME"), std::string::npos)
        << none.out;
}

TEST(Cli, KvExportAfterOnePassEqualsAfterChunks) {
    TempDir tmp;
    SafetensorsFile ref(kFixture + "/reference.safetensors");
    Tensor ids = ref.get("input_ids_0");  // 270 tokens
    {
        std::ofstream ids_file(tmp.file("ids.txt"));
        for (int64_t i = 0; i < ids.numel(); ++i) ids_file << ids.data<int64_t>()[i] << " ";
    }
    const std::string base = "run --model " + kFixture + " --input-ids-file " + tmp.file("ids.txt");
    ASSERT_EQ(run_cli(base + " --kv-out " + tmp.file("one")).code, 0);
    ASSERT_EQ(run_cli(base + " --cp 2 --chunk 131 --kv-out " + tmp.file("chunks")).code, 0);
    SafetensorsFile a(tmp.file("one") + "/request_0.safetensors");
    SafetensorsFile b(tmp.file("chunks") + "/request_0.safetensors");
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    EXPECT_TRUE(a.has("layers.1.compressor.overlap_kv"));  // CSA layer of this fixture
    EXPECT_EQ(a.get("layers.0.window").dim(0), 127);
    for (const auto& [name, info] : a.tensors()) {
        Tensor x = a.get(name), y = b.get(name);
        ASSERT_EQ(x.shape(), y.shape()) << name;
        for (int64_t i = 0; i < x.numel(); ++i)
            ASSERT_NEAR(x.f32()[i], y.f32()[i], 1e-5 * (1 + std::abs(x.f32()[i])))
                << name << " " << i;
    }
    EXPECT_EQ(a.metadata().at("n_tokens"), "270");
}

TEST(Cli, JsonOutput) {
    Result r = run_cli("run --model " + kFixture + " --input-ids 3,4,5 --json --cp 2 --tbo on");
    ASSERT_EQ(r.code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["requests"][0]["tokens"], 3);
    EXPECT_TRUE(j["requests"][0]["first_token"].is_number_integer());
    EXPECT_EQ(j["cp"], 2);
    EXPECT_GT(j["timings"]["ttft_s"].get<double>(), 0.0);
    EXPECT_GT(j["timings"]["warmup_s"].get<double>(), 0.0);  // a warm-up batch ran first
    EXPECT_GT(j["memory"]["peak_rss_bytes"].get<int64_t>(), 0);
    EXPECT_TRUE(j["timings"]["repeat_ttft_s"].empty());  // no --repeat
}

TEST(Cli, RepeatTimesTheBatchAgainWithTheSameOutputs) {
    Result once = run_cli("run --model " + kFixture + " --input-ids 3,4,5,6 --json");
    Result r = run_cli("run --model " + kFixture + " --input-ids 3,4,5,6 --json --repeat 3");
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(once.code, 0) << once.out;
    auto j = nlohmann::json::parse(r.out), k = nlohmann::json::parse(once.out);
    ASSERT_EQ(j["timings"]["repeat_ttft_s"].size(), 2u);  // the first run is ttft_s
    for (const auto& t : j["timings"]["repeat_ttft_s"]) EXPECT_GT(t.get<double>(), 0.0);
    EXPECT_EQ(j["requests"], k["requests"]);
    Result bad = run_cli("run --model " + kFixture + " --input-ids 3 --repeat 0");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.out.find("--repeat"), std::string::npos) << bad.out;
}

TEST(Cli, UsageErrorExitsWithTwo) {
    EXPECT_EQ(run_cli("run --input-ids 1").code, 2);
    EXPECT_EQ(run_cli("no-such-command").code, 2);
}

TEST(Cli, PromptTextIsTokenisedAndTheFirstTokenPrinted) {
    // A small model with the real vocabulary, so DeepSeek's tokenizer ids fit.
    TempDir tmp;
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixture + "/config.json"));
    cfg["vocab_size"] = 129280;
    std::ofstream(tmp.file("config.json")) << cfg.dump(2);
    ASSERT_EQ(
        run_cli("gen-model --config " + tmp.file("config.json") + " --out " + tmp.file("m")).code,
        0);
    Result r = run_cli("run --model " + tmp.file("m") + " --prompt 'Hello, world! 你好'");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("first token"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\""), std::string::npos) << r.out;  // decoded text in quotes
    // BOS + the text's tokens; --no-bos drops the BOS.
    EXPECT_NE(r.out.find("request 0: 7 tokens"), std::string::npos) << r.out;
    Result nb = run_cli("run --model " + tmp.file("m") + " --no-bos --prompt 'Hello, world! 你好'");
    EXPECT_NE(nb.out.find("request 0: 6 tokens"), std::string::npos) << nb.out;
    // A model whose vocabulary is smaller than the tokenizer's: a clear error.
    expect_clean_error(run_cli("run --model " + kFixture + " --prompt 'Hello, world'"),
                       {"vocab_size 256"});
}

TEST(Cli, TruncatedFile) {
    TempDir tmp;
    copy_model(tmp);
    fs::resize_file(tmp.file("model.safetensors"),
                    fs::file_size(tmp.file("model.safetensors")) / 2);
    expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2"),
                       {"model.safetensors"});
}

TEST(Cli, HeaderOffsetsOutsideFile) {
    TempDir tmp;
    copy_model(tmp);
    std::string h = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    test::write_file(tmp.file("model.safetensors"), test::safetensors_bytes(h, std::string(8, 0)));
    expect_clean_error(run_cli("inspect --model " + tmp.path().string()), {"model.safetensors"});
}

TEST(Cli, UnknownDtype) {
    TempDir tmp;
    copy_model(tmp);
    std::string h = R"({"x":{"dtype":"Q7","shape":[4],"data_offsets":[0,4]}})";
    test::write_file(tmp.file("model.safetensors"), test::safetensors_bytes(h, std::string(4, 0)));
    expect_clean_error(run_cli("inspect --model " + tmp.path().string()), {"Q7"});
}

TEST(Cli, WrongShape) {
    TempDir tmp;
    copy_model(tmp);
    edit_tensors(tmp, [](auto& ts) {
        for (auto& [name, t] : ts)
            if (name == "model.layers.1.attn.wq_a.weight")
                t = Tensor::zeros(t.dtype(), {t.dim(0) + 1, t.dim(1)});
    });
    expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2"),
                       {"wq_a", "expected shape [32, 32]", "found [33, 32]"});
}

TEST(Cli, WrongDtype) {
    TempDir tmp;
    copy_model(tmp);
    edit_tensors(tmp, [](auto& ts) {
        for (auto& [name, t] : ts)
            if (name == "model.layers.0.ffn.gate.tid2eid") t = Tensor::zeros(DType::F32, t.shape());
    });
    expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2"),
                       {"tid2eid", "F32"});
}

TEST(Cli, MissingTensor) {
    TempDir tmp;
    copy_model(tmp);
    edit_tensors(tmp, [](auto& ts) {
        std::erase_if(ts, [](const auto& p) { return p.first == "model.layers.2.attn.attn_sink"; });
    });
    expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2"),
                       {"attn_sink"});
}

TEST(Cli, ConfigMissingAndInconsistentFields) {
    for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"hidden_size", nullptr}, {"o_groups", 3}}) {
        TempDir tmp;
        copy_model(tmp);
        nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tmp.file("config.json")));
        if (value.is_null())
            cfg.erase(field);
        else
            cfg[field] = value;
        std::ofstream(tmp.file("config.json")) << cfg.dump(2);
        expect_clean_error(run_cli("run --model " + tmp.path().string() + " --input-ids 1,2"),
                           {field, "config.json"});
    }
}

TEST(Cli, TokenIdOutOfRange) {
    expect_clean_error(run_cli("run --model " + kFixture + " --input-ids 1,2,256"),
                       {"256", "vocab_size 256"});
}

// A model whose fp32 weights do not fit into the host memory left is refused before loading, with
// the bytes needed and available; the same run fits when the memory does.
TEST(Cli, NotEnoughHostMemory) {
    ASSERT_EQ(::setenv("CPFILL_HOST_MEMORY", "64K", 1), 0);  // inherited by the child process
    const auto refused = run_cli("run --model " + kFixture + " --input-ids 1,2,3 --cp 2");
    ASSERT_EQ(::unsetenv("CPFILL_HOST_MEMORY"), 0);
    expect_clean_error(refused, {"out of host memory", "all 2 ranks of --cp 2",
                                 "0.00 GB are available", "CPFILL_HOST_MEMORY", "--device cuda"});
    const auto ok = run_cli("run --model " + kFixture + " --input-ids 1,2,3 --cp 2");
    EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(Cli, EmptyPrompt) {
    TempDir tmp;
    test::write_file(tmp.file("empty.txt"), "\n\n");
    expect_clean_error(
        run_cli("run --model " + kFixture + " --input-ids-file " + tmp.file("empty.txt")),
        {"empty.txt"});
    expect_clean_error(run_cli("run --model " + kFixture + " --input-ids ,"), {"empty prompt"});
}

TEST(Cli, NotATokenId) {
    expect_clean_error(run_cli("run --model " + kFixture + " --input-ids 1,x2"), {"x2"});
}

TEST(Cli, MissingModelFolder) {
    expect_clean_error(run_cli("run --model /nonexistent/model --input-ids 1"),
                       {"/nonexistent/model"});
}

TEST(Cli, CudaDeviceWithoutBackend) {
    expect_clean_error(run_cli("run --model " + kFixture + " --input-ids 1 --device cuda"),
                       {"cuda"});
}

// The tiny-text preset has DeepSeek's vocabulary: the README's text examples run on it.
TEST(Cli, TinyTextPresetRunsTheReadmeTextExamples) {
    TempDir tmp;
    const std::string m = tmp.file("m");
    Result g = run_cli("gen-model --preset tiny-text --out " + m);
    ASSERT_EQ(g.code, 0) << g.out;
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(m + "/config.json"));
    EXPECT_EQ(cfg["vocab_size"], 129280);
    Result r = run_cli("run --model " + m + " --prompt \"Hello\" --cp 4 --tbo on");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("first token"), std::string::npos) << r.out;
    std::string text;
    for (int i = 0; i < 40; ++i)
        text += "The quick brown fox jumps over the lazy dog. 你好，世界！\n";
    test::write_file(tmp.file("long.txt"), text);
    Result j = run_cli("run --model " + m + " --prompt-file " + tmp.file("long.txt") +
                       " --chunk 4096 --kv-out " + tmp.file("kv") + " --json");
    ASSERT_EQ(j.code, 0) << j.out;
    auto out = nlohmann::json::parse(j.out);
    EXPECT_GT(out["requests"][0]["tokens"].get<int>(), 400) << j.out;
    EXPECT_TRUE(fs::exists(tmp.file("kv") + "/request_0.safetensors"));
}

// Whether `out` holds a source location "[dir/file.cpp:123]" (.cpp, .cu or .h).
bool has_source_location(const std::string& out) {
    for (const std::string ext : {".cpp:", ".cu:", ".h:"})
        for (size_t at = out.find(ext); at != std::string::npos; at = out.find(ext, at + 1)) {
            size_t end = at + ext.size();
            while (end < out.size() && std::isdigit(static_cast<unsigned char>(out[end]))) ++end;
            if (end > at + ext.size() && end < out.size() && out[end] == ']' &&
                out.rfind('[', at) != std::string::npos)
                return true;
        }
    return false;
}

// Error lines end in the source location only with CPFILL_DEBUG=1 (docs/cli.md).
TEST(Cli, SourceLocationsOnlyWithDebug) {
    const std::string args = "run --model " + kFixture + " --input-ids 1,2,256";
    Result plain = run_cli(args);
    expect_clean_error(plain, {"vocab_size 256"});
    EXPECT_FALSE(has_source_location(plain.out)) << plain.out;
    ASSERT_EQ(::setenv("CPFILL_DEBUG", "1", 1), 0);  // inherited by the child process
    Result debug = run_cli(args);
    ASSERT_EQ(::unsetenv("CPFILL_DEBUG"), 0);
    expect_clean_error(debug, {"vocab_size 256"});
    EXPECT_TRUE(has_source_location(debug.out)) << debug.out;
}

// Expects a usage error: exit code 2 and one "error:" line, at the start, containing every part.
void expect_usage_error(const Result& r, const std::vector<std::string>& parts) {
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
    EXPECT_EQ(r.out.find("error:", 1), std::string::npos) << r.out;
    for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << p << "\n" << r.out;
}

TEST(Cli, MisspeltNamesGetTheNearestSuggested) {
    expect_usage_error(run_cli("run --model " + kFixture + " --input-id 1,2"),
                       {"--input-id", "did you mean --input-ids?"});
    expect_usage_error(run_cli("run --model " + kFixture + " --thread=2 --input-ids 1"),
                       {"did you mean --threads?"});
    expect_usage_error(run_cli("rnu --model " + kFixture + " --input-ids 1"),
                       {"rnu", "did you mean run?"});
    // Nothing near: CLI11's own message, still one error: line.
    expect_usage_error(run_cli("run --model " + kFixture + " --frobnicate"), {"--frobnicate"});
    expect_usage_error(run_cli("run --input-ids 1"), {"--model"});
}

TEST(Cli, ThreadsOutsideTheirRangeAreUsageErrors) {
    const int max = 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const std::string range = "0 (all hardware threads) to " + std::to_string(max);
    const std::string base = "run --model " + kFixture + " --input-ids 1,2 --threads ";
    expect_usage_error(run_cli(base + "-1"), {"--threads", range, "found -1"});
    expect_usage_error(run_cli(base + std::to_string(max + 1)), {"--threads", range});
    if (max < 1000) expect_usage_error(run_cli(base + "1000"), {"--threads", range});
    expect_usage_error(run_cli("demo --threads -1"), {"--threads", range});
    Result ok = run_cli(base + "2");
    EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(Cli, UnknownDeviceIsAUsageError) {
    expect_usage_error(run_cli("run --model " + kFixture + " --input-ids 1 --device tpu"),
                       {"--device", "tpu"});
}

// bench --expert-gemm takes auto, grouped or streams; anything else is refused before any work
// and the message names what was given and what is allowed.
TEST(Cli, UnknownExpertGemmIsAUsageError) {
    expect_usage_error(run_cli("bench --expert-gemm fastest"),
                       {"--expert-gemm", "fastest", "auto", "grouped", "streams"});
}

TEST(Cli, UnknownMhcFusedIsAUsageError) {
    expect_usage_error(run_cli("bench --mhc-fused maybe"), {"--mhc-fused", "maybe", "on", "off"});
}

TEST(Cli, UnknownResidualIsAUsageError) {
    for (const char* cmd : {"run --model m --input-ids 1", "serve --model m", "bench"})
        expect_usage_error(run_cli(std::string(cmd) + " --residual fp16"),
                           {"--residual", "fp16", "fp32", "bf16"});
}

// --residual bf16 on CPU ranks: the residual rounded to bf16 at every update (docs/numerics.md),
// said in the JSON; the logits move, by about bf16's resolution, not more.
TEST(Cli, Bf16ResidualRunsOnCpuRanksAndIsReported) {
    TempDir tmp;
    const std::string base = "run --model " + kFixture + " --input-ids 3,4,5,6,7,8 --json";
    Result f = run_cli(base + " --logits-out " + tmp.file("f.safetensors"));
    Result b = run_cli(base + " --residual bf16 --logits-out " + tmp.file("b.safetensors"));
    ASSERT_EQ(f.code, 0) << f.out;
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_EQ(nlohmann::json::parse(f.out)["residual"], "fp32");
    EXPECT_EQ(nlohmann::json::parse(b.out)["residual"], "bf16");
    Tensor lf = SafetensorsFile(tmp.file("f.safetensors")).get("logits");
    Tensor lb = SafetensorsFile(tmp.file("b.safetensors")).get("logits");
    ASSERT_EQ(lf.shape(), lb.shape());
    double num = 0, den = 0;
    for (int64_t i = 0; i < lf.numel(); ++i) {
        num += (double(lb.f32()[i]) - lf.f32()[i]) * (double(lb.f32()[i]) - lf.f32()[i]);
        den += double(lf.f32()[i]) * lf.f32()[i];
    }
    EXPECT_GT(num, 0.0);                    // the rounding acted
    EXPECT_LE(std::sqrt(num / den), 0.02);  // and by little (bf16: 2^-9 per rounding)
}

TEST(Cli, TestHookIsNotInTheHelp) {
    Result h = run_cli("run --help");
    EXPECT_EQ(h.code, 0) << h.out;
    EXPECT_NE(h.out.find("--threads"), std::string::npos) << h.out;
    EXPECT_EQ(h.out.find("inject-fault"), std::string::npos) << h.out;
}

}  // namespace
}  // namespace cpfill
