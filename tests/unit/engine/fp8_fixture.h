// The fp8 fidelity fixture, one definition for the CPU study (tests/unit/engine/
// test_fp8_activations.cpp) and the GPU comparison (tests/cuda/test_gpu_fp8_prefill.cpp), whose
// figures docs/fp8.md sets side by side: tiny with 16 indexer heads (fewer make the indexer's top-k
// boundary a tie) and every width a multiple of 128, an upstream-format checkpoint with fp8
// linears and fp4 experts, two requests of random ids.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "../io/io_test_util.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"

namespace cpfill::test {

inline ModelConfig fp8_fixture_config() {
    ModelConfig c = preset_config("tiny");
    c.index_n_heads = 16;
    return c;
}

inline void write_fp8_fixture(const std::string& dir) {
    RandomCheckpointOptions o;
    o.seed = 11;
    o.names = "upstream";
    o.dtype = "fp8";
    o.experts = "fp4";
    o.threads = 2;
    write_random_checkpoint(fp8_fixture_config(), dir, o);
}

// The fixture written once per test binary into a temporary folder (removed at exit), for the
// files that share it (tests/cuda/test_gpu_fp8_prefill.cpp, test_gpu_bf16_residual.cpp).
inline const std::string& fp8_fixture_dir() {
    static TempDir dir;
    static const std::string path = [] {
        write_fp8_fixture(dir.path().string());
        return dir.path().string();
    }();
    return path;
}

// Two requests (207 and 142 tokens: odd local row counts) of random ids.
inline std::vector<std::vector<int32_t>> fp8_fixture_requests() {
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int32_t> id(0, fp8_fixture_config().vocab_size - 1);
    std::vector<std::vector<int32_t>> r{std::vector<int32_t>(207), std::vector<int32_t>(142)};
    for (auto& req : r)
        for (int32_t& t : req) t = id(rng);
    return r;
}

}  // namespace cpfill::test
