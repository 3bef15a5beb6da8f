// mHC: Sinkhorn output is (nearly) doubly stochastic, the collapse uses raw streams, the expansion
// applies comb transposed.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ops/mhc.h"

namespace cpfill {
namespace {

TEST(Mhc, SinkhornAndCollapse) {
    const int hc = 4;
    const int64_t D = 8, rows = 3;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> fn(24 * hc * D), base(24), scale = {0.7f, 1.1f, 0.9f}, h(rows * hc * D);
    for (auto* v : {&fn, &base, &h})
        for (float& x : *v) x = nd(rng);
    ops::MhcParams p{fn.data(), base.data(), scale.data(), hc, D, 20, 1e-6f, 1e-6f};
    std::vector<float> post(rows * hc), comb(rows * hc * hc), x(rows * D), mix(rows * 24),
        normed(rows * hc * D);
    ThreadPool pool(2);
    ops::mhc_pre(p, h.data(), rows, post.data(), comb.data(), x.data(), mix.data(), normed.data(),
                 pool);
    for (int64_t t = 0; t < rows; ++t) {
        for (int j = 0; j < hc; ++j) {
            float rs = 0, cs = 0;
            for (int k = 0; k < hc; ++k) {
                rs += comb[t * 16 + j * hc + k];
                cs += comb[t * 16 + k * hc + j];
            }
            // 19 Sinkhorn rounds on N(0,1)-sized logits leave rows only near 1; columns are
            // normalised last and so are exact.
            EXPECT_NEAR(rs, 1.0f, 5e-2);
            EXPECT_NEAR(cs, 1.0f, 1e-5);  // the last normalisation is over columns
            EXPECT_GT(post[t * hc + j], 0.0f);
            EXPECT_LT(post[t * hc + j], 2.0f);
        }
    }
    // Expansion: o = 0 leaves Σ_j comb[j,k] h[j].
    std::vector<float> o(rows * D, 0.0f), h2 = h;
    ops::mhc_post(post.data(), comb.data(), o.data(), hc, D, rows, h2.data(), pool);
    for (int k = 0; k < hc; ++k) {
        float e = 0;
        for (int j = 0; j < hc; ++j) e += comb[j * hc + k] * h[j * D + 5];
        EXPECT_NEAR(h2[k * D + 5], e, 1e-5);
    }
}

}  // namespace
}  // namespace cpfill
