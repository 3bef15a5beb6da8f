// The GPU upload from stored bytes (model/cuda/gpu_weights.h upload_stored_*, docs/loading.md):
// for checkpoints of every stored form (f32, bf16, fp8 + fp8 experts, fp8 + fp4 experts; flat
// and stacked hf-module naming; tiny: sliding, CSA and HCA layers, hash and learned routing) and
// --cp 1 / 2 / 3 (slices that cut fp4 bytes and fp8 tiles), the device weights equal, byte for
// byte, those uploaded from the host loader's f32 (load_rank_weights + upload_weights), with the
// ranks' uploads running at once on threads as GpuGroup runs them, and with a plan for one rank
// only (a process under mpirun). A NaN weight or an E8M0 NaN scale gives the host loader's error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "../unit/io/io_test_util.h"
#include "cuda_test_util.h"
#include "engine/prefill_engine.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "model/cuda/gpu_weights.h"
#include "model/weights.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

ModelConfig config() {
    ModelConfig c = preset_config("tiny");
    c.index_n_heads = 16;
    return c;
}

std::string write_checkpoint(const test::TempDir& dir, const std::string& names,
                             const std::string& dtype, const std::string& experts) {
    RandomCheckpointOptions o;
    o.seed = 3;
    o.names = names;
    o.dtype = dtype;
    o.experts = experts;
    o.threads = 2;
    write_random_checkpoint(config(), dir.path().string(), o);
    return dir.path().string();
}

std::vector<uint8_t> bytes_of(const cuda::DeviceBuffer& b) {
    return test_cuda::download<uint8_t>(b, b.bytes());
}

// Every buffer of `got` equals `want`'s; the counters too.
void expect_same(const cuda::GpuWeights& got, const cuda::GpuWeights& want,
                 const std::string& what) {
    const auto g = cuda::device_buffers(got), w = cuda::device_buffers(want);
    ASSERT_EQ(g.size(), w.size()) << what;
    for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_EQ(g[i].first, w[i].first) << what;
        EXPECT_TRUE(bytes_of(*g[i].second) == bytes_of(*w[i].second))
            << what << ": " << g[i].first << " differs (" << g[i].second->bytes() << " vs "
            << w[i].second->bytes() << " bytes)";
    }
    EXPECT_EQ(got.bytes, want.bytes) << what;
    EXPECT_EQ(got.fp8_values, want.fp8_values) << what;
    EXPECT_EQ(got.fp8_inexact, want.fp8_inexact) << what;
}

// The stored upload of every slice of `cp` (ranks on threads, one reader) and, for the last
// rank, with a plan of its own slice only.
std::vector<cuda::GpuWeights> stored_upload(const Checkpoint& ck, int cp, GpuWeightFormat format,
                                            const std::vector<int>& ranks, size_t* misses) {
    std::vector<ExpertSlice> slices;
    for (int r : ranks) slices.push_back({r, cp});
    // Small pieces and few slots, so that pieces wrap the ring and rows split into pieces.
    cuda::StoredReader rd(ck, cuda::stored_upload_plan(ck, slices, size_t{1} << 18), 2, 3, nullptr);
    std::vector<cuda::GpuWeights> out(ranks.size());
    std::vector<std::string> errors(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i)
        threads.emplace_back([&, i] {
            try {
                CPFILL_CUDA_CHECK(cudaSetDevice(0));
                out[i] = cuda::upload_stored_top(ck, slices[i], format, rd);
                for (int li = 0; li < ck.config().n_layers; ++li)
                    cuda::upload_stored_layer(out[i], li, ck, rd);
            } catch (const std::exception& e) {
                errors[i] = e.what();
                rd.abort();
            }
        });
    for (std::thread& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    if (misses) *misses = rd.misses();
    return out;
}

struct Form {
    const char *names, *dtype, *experts;
};

class StoredUpload : public testing::TestWithParam<Form> {};

TEST_P(StoredUpload, EqualsTheHostUploadByteForByte) {
    CPFILL_SKIP_WITHOUT_GPU();
    const Form f = GetParam();
    test::TempDir dir;
    const Checkpoint ck(write_checkpoint(dir, f.names, f.dtype, f.experts));
    for (const GpuWeightFormat format : {GpuWeightFormat::Bf16, stored_gpu_format(ck)})
        for (int cp : {1, 2, 3}) {
            const std::string what = fmt::format("{} {} {} as {} at cp {}", f.names, f.dtype,
                                                 f.experts, gpu_weight_format_name(format), cp);
            LoadOptions lo;
            lo.threads = 2;
            const std::vector<ModelWeights> host = load_rank_weights(ck, cp, lo);
            std::vector<int> all;
            for (int r = 0; r < cp; ++r) all.push_back(r);
            size_t misses = 0;
            const std::vector<cuda::GpuWeights> got = stored_upload(ck, cp, format, all, &misses);
            for (int r = 0; r < cp; ++r)
                expect_same(got[r], cuda::upload_weights(host[r], format),
                            what + fmt::format(" rank {}", r));
            // One process's rank alone (mpirun): its plan holds only its rows of w1 / w3.
            const std::vector<cuda::GpuWeights> last =
                stored_upload(ck, cp, format, {cp - 1}, nullptr);
            expect_same(last[0], cuda::upload_weights(host[cp - 1], format), what + " alone");
            std::printf("[ info ] %s: %zu pieces read on the spot\n", what.c_str(), misses);
        }
}

INSTANTIATE_TEST_SUITE_P(Forms, StoredUpload,
                         testing::Values(Form{"hf", "f32", "same"}, Form{"hf", "bf16", "same"},
                                         Form{"upstream", "fp8", "same"},
                                         Form{"upstream", "fp8", "fp4"},
                                         Form{"hf-module", "fp8", "fp4"}));

// Overwrites `n` bytes at byte `offset` of stored tensor `stored` of the checkpoint in `dir`.
void poke(const Checkpoint& ck, const std::string& stored, size_t offset, const void* bytes,
          size_t n) {
    const TensorInfo& info = ck.files().info(stored);
    std::fstream f(info.file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    f.seekp(static_cast<std::streamoff>(8 + header + info.begin + offset));
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
    ASSERT_TRUE(f.good());
}

// The errors of the host loader and of the stored upload (as `format`) for the checkpoint at
// `path`: run apart from stored_upload, which reports errors through EXPECT.
std::pair<std::string, std::string> errors_of(const std::string& path, GpuWeightFormat format) {
    const Checkpoint ck(path);
    std::pair<std::string, std::string> e;
    try {
        load_rank_weights(ck, 1, LoadOptions{});
    } catch (const std::exception& x) {
        e.first = x.what();
    }
    try {
        cuda::StoredReader rd(ck, cuda::stored_upload_plan(ck, {{0, 1}}, size_t{1} << 20), 1, 2,
                              nullptr);
        cuda::GpuWeights w = cuda::upload_stored_top(ck, {0, 1}, format, rd);
        for (int li = 0; li < ck.config().n_layers; ++li) cuda::upload_stored_layer(w, li, ck, rd);
    } catch (const std::exception& x) {
        e.second = x.what();
    }
    return e;
}

TEST(StoredUploadErrors, ABadWeightGivesTheHostLoadersError) {
    CPFILL_SKIP_WITHOUT_GPU();
    {
        test::TempDir dir;
        const std::string path = write_checkpoint(dir, "hf", "bf16", "same");
        const uint16_t nan = 0x7fc0;
        poke(Checkpoint(path), Checkpoint(path).stored("layers.1.attn.wkv.weight").name, 2 * 77,
             &nan, 2);
        const auto [host, gpu] = errors_of(path, GpuWeightFormat::Bf16);
        EXPECT_NE(host.find("expected a finite value"), std::string::npos) << host;
        EXPECT_EQ(gpu, host);
    }
    {
        test::TempDir dir;
        const std::string path = write_checkpoint(dir, "upstream", "fp8", "fp4");
        const uint8_t nan = 0xff;  // an E8M0 NaN scale of an fp4 expert
        const StoredWeight sw = Checkpoint(path).stored("layers.2.ffn.experts.5.w2.weight");
        poke(Checkpoint(path), sw.scale_name, 3, &nan, 1);
        const auto [host, gpu] = errors_of(path, GpuWeightFormat::Fp4);
        EXPECT_NE(host.find("expected a finite value"), std::string::npos) << host;
        EXPECT_EQ(gpu, host);
    }
}

}  // namespace
}  // namespace cpfill
