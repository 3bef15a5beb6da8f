// Helpers for the golden tests: fixture discovery under tests/data and tensor comparison with a
// report of the worst element (max-abs error relative to the reference's max-abs value).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace cpfill::testing {

// Every folder of tests/data holding config.json and reference.safetensors.
inline std::vector<std::string> golden_fixtures() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(CPFILL_TEST_DATA_DIR))
        if (e.is_directory() && std::filesystem::exists(e.path() / "reference.safetensors") &&
            std::filesystem::exists(e.path() / "config.json"))
            out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

struct Diff {
    double max_abs = 0, ref_max = 0, rel = 0;
    int64_t worst = -1;
};

// rel = max|a − b| / max|b| over the tensor; both F32 of equal element count.
inline Diff compare(const float* a, const float* b, int64_t n) {
    Diff d;
    for (int64_t i = 0; i < n; ++i) {
        double e = std::abs(double(a[i]) - double(b[i]));
        if (!(e <= d.max_abs)) {  // catches NaN too
            d.max_abs = e;
            d.worst = i;
        }
        d.ref_max = std::max(d.ref_max, std::abs(double(b[i])));
    }
    d.rel = d.ref_max > 0 ? d.max_abs / d.ref_max : d.max_abs;
    return d;
}

inline ::testing::AssertionResult close(const std::string& what, const Tensor& actual,
                                        const Tensor& expected, double tol, Diff* out = nullptr) {
    if (actual.numel() != expected.numel())
        return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                             << " vs expected " << shape_str(expected.shape());
    Diff d = compare(actual.f32(), expected.f32(), actual.numel());
    if (out) *out = d;
    if (d.rel <= tol) return ::testing::AssertionSuccess();
    auto f = ::testing::AssertionFailure();
    f << what << ": relative error " << d.rel << " > " << tol << " (max abs " << d.max_abs
      << " at flat index " << d.worst << ", reference max " << d.ref_max << ")";
    if (d.worst >= 0)
        f << "; actual " << actual.f32()[d.worst] << " expected " << expected.f32()[d.worst];
    return f;
}

}  // namespace cpfill::testing
