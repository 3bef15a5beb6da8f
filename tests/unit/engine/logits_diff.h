// How far one run's logits are from a reference run's, row by row: one definition for the CPU
// numerics studies (test_fp8_activations.cpp, test_indexer_rounding.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor.h"

namespace cpfill::test {

struct LogitsDiff {
    int64_t rows = 0, argmax_same = 0;
    std::vector<double> row_err;  // ‖got − ref‖ / ‖ref‖ per row, sorted ascending
    double num = 0, den = 0;      // Σ ‖got − ref‖², Σ ‖ref‖² over all rows
    bool any_differ = false;      // some logit is not bit-equal to the reference's

    double argmax() const { return double(argmax_same) / double(rows); }
    double median() const { return row_err[row_err.size() / 2]; }
    double p90() const { return row_err[row_err.size() * 9 / 10]; }
    double frobenius() const { return std::sqrt(num / den); }
};

// got and ref: per request [tokens, vocab] fp32. Fails (fatally) on differing shapes or a
// non-finite logit in got; call through ASSERT_NO_FATAL_FAILURE.
inline void diff_logits(const std::vector<Tensor>& got, const std::vector<Tensor>& ref,
                        LogitsDiff* d) {
    ASSERT_EQ(got.size(), ref.size());
    for (size_t r = 0; r < ref.size(); ++r) {
        const Tensor &a = got[r], &b = ref[r];
        ASSERT_EQ(a.shape(), b.shape());
        const int64_t V = b.dim(1);
        for (int64_t t = 0; t < b.dim(0); ++t, ++d->rows) {
            const float *pa = a.f32() + t * V, *pb = b.f32() + t * V;
            d->argmax_same +=
                std::max_element(pa, pa + V) - pa == std::max_element(pb, pb + V) - pb;
            double rn = 0, rd = 0;
            for (int64_t v = 0; v < V; ++v) {
                ASSERT_TRUE(std::isfinite(pa[v])) << "row " << d->rows;
                d->any_differ |= pa[v] != pb[v];
                rn += (double(pa[v]) - pb[v]) * (double(pa[v]) - pb[v]);
                rd += double(pb[v]) * pb[v];
            }
            d->num += rn;
            d->den += rd;
            d->row_err.push_back(std::sqrt(rn / rd));
        }
    }
    std::sort(d->row_err.begin(), d->row_err.end());
}

}  // namespace cpfill::test
