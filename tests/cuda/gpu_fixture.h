// The GPU prefill tests' fixtures (test_gpu_prefill.cpp, test_gpu_chunks.cpp): an HF fixture's
// weights for C ranks with its requests and reference tensors, and the comparison rule of
// bf16 against fp32 (the file comment of test_gpu_prefill.cpp says why rows may be outliers).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../golden/golden_util.h"
#include "engine/prefill_engine.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "parallel/gpu_prefill.h"

namespace cpfill::gpu_test {

// bf16 weights and activations against fp32 (docs/design.md §3).
constexpr double kTolerance = 2e-2;
constexpr double kOutlierRows = 0.10;

// A tensor passes when at most kOutlierRows of its token rows are off by more than tol of its
// max-abs value and the other rows are within tol, Frobenius-relative (test_gpu_prefill.cpp).
inline ::testing::AssertionResult close(const std::string& what, const Tensor& actual,
                                        const Tensor& expected, double tol,
                                        double* frob_out = nullptr) {
    if (actual.numel() != expected.numel())
        return ::testing::AssertionFailure()
               << what << ": " << actual.numel() << " values vs " << expected.numel();
    const testing::RowErrors e = testing::row_errors(actual, expected, tol);
    if (!e.finite) return ::testing::AssertionFailure() << what << ": non-finite";
    if (frob_out) *frob_out = e.frob;
    std::printf(
        "[ compare ] %s: %lld of %lld rows over %.0e, the others frobenius-relative %.3g (worst "
        "row "
        "%lld: max abs %.3g of %.3g)\n",
        what.c_str(), static_cast<long long>(e.outliers), static_cast<long long>(e.rows), tol,
        e.frob, static_cast<long long>(e.worst_row), e.worst, e.ref_max);
    if (e.frob <= tol && e.outliers <= static_cast<int64_t>(kOutlierRows * e.rows))
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": frobenius-relative error " << e.frob << " (limit " << tol << "), "
           << e.outliers << " of " << e.rows << " rows off by more than " << tol
           << " of the max (limit " << kOutlierRows * 100 << "%)";
}

struct Fixture {
    std::string dir;
    ModelConfig cfg;
    std::vector<ModelWeights> ranks;
    std::unique_ptr<SafetensorsFile> ref;
    std::vector<std::vector<int32_t>> requests;
    std::string suffix(int r) const {
        return requests.size() > 1 ? fmt::format("_{}", r) : std::string();
    }
};

inline Fixture load_fixture(const std::string& dir, int cp) {
    Fixture f;
    f.dir = dir;
    Checkpoint ck(dir);
    f.cfg = ck.config();
    f.ranks = load_rank_weights(ck, cp, LoadOptions{});
    f.ref = std::make_unique<SafetensorsFile>(dir + "/reference.safetensors");
    auto ids = [](const Tensor& t) {
        std::vector<int32_t> out;
        for (int64_t i = 0; i < t.numel(); ++i) out.push_back(int32_t(t.data<int64_t>()[i]));
        return out;
    };
    if (f.ref->has("input_ids"))
        f.requests.push_back(ids(f.ref->get("input_ids")));
    else
        for (int r = 0; f.ref->has(fmt::format("input_ids_{}", r)); ++r)
            f.requests.push_back(ids(f.ref->get(fmt::format("input_ids_{}", r))));
    return f;
}

inline int32_t last_argmax(const Tensor& logits) {
    const int64_t V = logits.dim(logits.ndim() - 1);
    const int64_t rows = logits.numel() / V;
    return argmax(logits.f32() + (rows - 1) * V, V);
}

// Uploads the fixture's rank weights (load_fixture's cp) to the group.
inline void upload(GpuGroup& g, Fixture& f) {
    std::vector<const ModelWeights*> views;
    for (auto& w : f.ranks) views.push_back(&w);
    g.load(views);
}

}  // namespace cpfill::gpu_test
