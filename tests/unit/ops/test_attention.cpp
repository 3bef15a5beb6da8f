// attend_one against a direct evaluation of the softmax with a sink; index selection of entries.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/attention.h"

namespace cpfill {
namespace {

TEST(Attention, SingleKeyWithSink) {
    // One head of dim 2, one key k = v = (1, 2), q = (2, 0), scale 0.5 → logit 1.
    std::vector<float> q = {2, 0}, k = {1, 2}, out(2), scratch(16);
    float sink = 0.5f;
    ops::AttnKeys keys;
    keys.window = k.data();
    keys.n_window = 1;
    ops::attend_one(q.data(), 1, 2, keys, &sink, 0.5f, out.data(), scratch.data());
    const double p = std::exp(1.0) / (std::exp(1.0) + std::exp(0.5));
    EXPECT_NEAR(out[0], p * 1, 1e-6);
    EXPECT_NEAR(out[1], p * 2, 1e-6);
}

TEST(Attention, MatchesNaiveOverWindowAndSelectedEntries) {
    const int H = 3, d = 8;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> q(H * d), win(4 * d), ent(5 * d), sinks(H);
    for (auto* v : {&q, &win, &ent, &sinks})
        for (float& x : *v) x = nd(rng);
    std::vector<int32_t> idx = {4, 1};
    ops::AttnKeys keys{win.data(), 4, ent.data(), idx.data(), 2};
    std::vector<float> out(H * d), scratch((H + d) * 6);
    ops::attend_one(q.data(), H, d, keys, sinks.data(), 0.3f, out.data(), scratch.data());
    std::vector<const float*> rows = {&win[0],     &win[d],     &win[2 * d],
                                      &win[3 * d], &ent[4 * d], &ent[1 * d]};
    for (int h = 0; h < H; ++h) {
        std::vector<double> l;
        double den = std::exp(double(sinks[h]));
        for (auto* r : rows) {
            double s = 0;
            for (int c = 0; c < d; ++c) s += double(q[h * d + c]) * r[c];
            l.push_back(std::exp(0.3 * s));
            den += l.back();
        }
        for (int c = 0; c < d; ++c) {
            double e = 0;
            for (size_t j = 0; j < rows.size(); ++j) e += l[j] / den * rows[j][c];
            EXPECT_NEAR(out[h * d + c], e, 1e-5) << "h=" << h << " c=" << c;
        }
    }
}

}  // namespace
}  // namespace cpfill
