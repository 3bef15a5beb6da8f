// Helpers for the golden tests: fixture discovery under tests/data and tensor comparison with a
// report of the worst element (max-abs error relative to the reference's max-abs value).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
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

// Rows [row0, row0 + rows) of an f32 [n, ...] tensor as a new tensor.
inline Tensor rows_of(const Tensor& t, int64_t row0, int64_t rows) {
    Shape s = t.shape();
    const int64_t row = t.numel() / s[0];
    s[0] = rows;
    Tensor out = Tensor::empty(DType::F32, s);
    std::copy(t.f32() + row0 * row, t.f32() + (row0 + rows) * row, out.f32());
    return out;
}

// Row by row, actual against expected (f32, the same number of elements; rows = expected's first
// dimension, or 1 for a vector): the largest |expected|, the worst row's max-abs error and index,
// how many rows have a max-abs error above tol × that largest value (outliers), and the
// Frobenius-relative error ‖a − b‖ / ‖b‖ over the other rows. finite: actual has no NaN or Inf.
struct RowErrors {
    double ref_max = 0, worst = 0, frob = 0;
    int64_t rows = 0, outliers = 0, worst_row = -1;
    bool finite = true;
};

inline RowErrors row_errors(const Tensor& actual, const Tensor& expected, double tol) {
    RowErrors e;
    const float* a = actual.f32();
    const float* b = expected.f32();
    const int64_t n = expected.numel();
    e.rows = expected.ndim() > 1 ? expected.dim(0) : 1;
    const int64_t width = e.rows > 0 ? n / e.rows : 0;
    for (int64_t i = 0; i < n; ++i) {
        e.ref_max = std::max(e.ref_max, std::abs(double(b[i])));
        if (!std::isfinite(a[i])) e.finite = false;
    }
    double num = 0, den = 0;
    for (int64_t r = 0; r < e.rows; ++r) {
        double m = 0, rn = 0, rd = 0;
        for (int64_t c = r * width; c < (r + 1) * width; ++c) {
            const double d = double(a[c]) - double(b[c]);
            m = std::max(m, std::abs(d));
            rn += d * d;
            rd += double(b[c]) * b[c];
        }
        if (m > e.worst) {
            e.worst = m;
            e.worst_row = r;
        }
        if (m > tol * e.ref_max) {
            ++e.outliers;
            continue;
        }
        num += rn;
        den += rd;
    }
    e.frob = std::sqrt(num / std::max(den, 1e-30));
    return e;
}

// Whether query t selects different entries, compared as sets (−1 padding ignored): ref is HF's
// i64 [len, k_ref] for one request; mine is i32 [T, k_mine] over the batch, the request at row0.
inline bool topk_sets_differ(const Tensor& ref, const Tensor& mine, int64_t row0, int64_t t) {
    const int64_t kr = ref.dim(1), km = mine.dim(1);
    std::set<int64_t> a, b;
    for (int64_t j = 0; j < kr; ++j)
        if (ref.data<int64_t>()[t * kr + j] >= 0) a.insert(ref.data<int64_t>()[t * kr + j]);
    for (int64_t j = 0; j < km; ++j)
        if (mine.data<int32_t>()[(row0 + t) * km + j] >= 0)
            b.insert(mine.data<int32_t>()[(row0 + t) * km + j]);
    return a != b;
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
