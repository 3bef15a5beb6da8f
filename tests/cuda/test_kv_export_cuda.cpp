// `cpfill run --device cuda --kv-out DIR` against the CPU backend's export of the same prompt
// (docs/kv-state.md): the same files, tensor names, shapes and metadata; the values as close as
// bf16 allows. Layers 0–2 of dsv4_tiny_a (sliding, CSA, HCA) follow only hash-routed MoE layers,
// so no token can have picked another expert there: every value must be close. Later layers
// follow learned routing, where bf16 legitimately flips a few tokens' experts
// (test_gpu_prefill.cpp): their larger tensors get the row-outlier rule, their few-row tails only
// shape and finiteness. CP = 2 with TBO splits the prompt inside the request, so the compressor
// tails come from two sub-batches.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../golden/golden_util.h"
#include "cuda_test_util.h"
#include "io/safetensors.h"

namespace cpfill {
namespace {

const std::string kModel = std::string(CPFILL_TEST_DATA_DIR) + "/dsv4_tiny_a";
constexpr int kExactLayers = 3;  // layers 0–2: after hash-routed MoE only

std::string export_kv(const std::string& name, const std::string& device_args) {
    const auto dir = std::filesystem::temp_directory_path() / ("cpfill_kv_" + name);
    std::filesystem::remove_all(dir);
    const std::string cmd = fmt::format(
        "{} run --model {} --input-ids-file {}/reference.safetensors {} --kv-out {} > {}.log 2>&1",
        CPFILL_BINARY, kModel, kModel, device_args, dir.string(), dir.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return dir.string();
}

int layer_of(const std::string& name) {  // "layers.L.…"
    return std::stoi(name.substr(7, name.find('.', 7) - 7));
}

void expect_close_exports(const std::string& gpu_dir, const std::string& cpu_dir,
                          const std::string& what) {
    SafetensorsFile g(gpu_dir + "/request_0.safetensors"), c(cpu_dir + "/request_0.safetensors");
    EXPECT_EQ(g.metadata(), c.metadata()) << what;
    ASSERT_EQ(g.tensors().size(), c.tensors().size()) << what;
    int strict = 0;
    for (const auto& [name, info] : c.tensors()) {
        ASSERT_TRUE(g.has(name)) << what << ": " << name << " missing";
        const Tensor a = g.get(name), b = c.get(name);
        ASSERT_EQ(a.shape(), b.shape()) << what << ": " << name;
        const testing::RowErrors e = testing::row_errors(a, b, 2e-2);
        ASSERT_TRUE(e.finite) << what << ": " << name;
        const bool exact_layer = layer_of(name) < kExactLayers;
        std::printf(
            "[ kv ] %s %s [%lld x %lld]: max abs %.3g of %.3g, %lld outlier rows, others "
            "frobenius %.3g\n",
            what.c_str(), name.c_str(), static_cast<long long>(e.rows),
            static_cast<long long>(e.rows > 0 ? b.numel() / e.rows : 0), e.worst, e.ref_max,
            static_cast<long long>(e.outliers), e.frob);
        if (b.numel() == 0) continue;
        if (exact_layer) {
            ++strict;
            EXPECT_LE(e.worst, 5e-2 * e.ref_max) << what << ": " << name;
            EXPECT_LE(e.frob, 2e-2) << what << ": " << name;
        } else if (e.rows >= 10) {
            EXPECT_LE(e.outliers, e.rows / 10) << what << ": " << name;
            EXPECT_LE(e.frob, 2e-2) << what << ": " << name;
        }
    }
    EXPECT_GE(strict, 10) << what << ": too few tensors checked strictly";  // window, entries,
    // index_keys, compressor and indexer buffers and overlaps of layers 0–2
}

TEST(GpuKvExport, MatchesCpuExport) {
    CPFILL_SKIP_WITHOUT_GPU();
    const std::string cpu = export_kv("cpu", "");
    expect_close_exports(export_kv("cuda1", "--device cuda"), cpu, "CUDA CP=1");
    if (cuda_device_count(nullptr) >= 2)
        expect_close_exports(export_kv("cuda2", "--device cuda --cp 2 --tbo on"), cpu,
                             "CUDA CP=2 + TBO");
}

}  // namespace
}  // namespace cpfill
