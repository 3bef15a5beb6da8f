// The CPU forward against HF transformers float32 on every fixture in tests/data (made by
// scripts/reference/generate.py): per-layer residual streams, final hidden state and logits within
// 1e-4 relative (max-abs error / max-abs reference), and the same indexer selections as sets.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "core/parallel.h"
#include "golden_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "parallel/cp_prefill.h"

namespace cpfill {
namespace {

using testing::close;
using testing::golden_fixtures;
using testing::rows_of;

constexpr double kTolerance = 1e-4;  // docs/design.md §3

struct Fixture {
    std::string dir;
    ModelWeights weights;
    std::unique_ptr<SafetensorsFile> ref;
    int n_requests = 1;
    std::string suffix(int r) const { return n_requests > 1 ? fmt::format("_{}", r) : ""; }
};

Fixture load_fixture(const std::string& dir) {
    Fixture f;
    f.dir = dir;
    f.weights = load_weights(Checkpoint(dir));
    f.ref = std::make_unique<SafetensorsFile>(dir + "/reference.safetensors");
    f.n_requests = f.ref->has("input_ids") ? 1 : 0;
    if (!f.n_requests)
        while (f.ref->has(fmt::format("input_ids_{}", f.n_requests))) ++f.n_requests;
    return f;
}

std::vector<int32_t> ids_of(const Tensor& t) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < t.numel(); ++i)
        out.push_back(static_cast<int32_t>(t.data<int64_t>()[i]));
    return out;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesHfFloat32) {
    Fixture f = load_fixture(GetParam());
    ASSERT_GT(f.n_requests, 0) << "no input_ids in " << f.dir;
    const ModelConfig& cfg = f.weights.cfg;
    std::vector<std::vector<int32_t>> requests;
    for (int r = 0; r < f.n_requests; ++r)
        requests.push_back(ids_of(f.ref->get("input_ids" + f.suffix(r))));
    Batch batch = make_batch(requests, cfg.vocab_size);
    PrefillOptions opt;
    opt.threads = 2;
    opt.all_logits = opt.record_hidden = opt.record_topk = true;
    PrefillOutput out = cp_prefill({&f.weights}, requests, opt);

    double worst = 0;
    for (int r = 0; r < f.n_requests; ++r) {
        const std::string sfx = f.suffix(r);
        const int64_t row0 = batch.segments[r].row0, len = batch.segments[r].len;
        // hidden_states_i: streams after the embedding and layers 0 … L−2, then the final [S, D].
        for (int i = 0; i <= cfg.n_layers; ++i) {
            const Tensor& mine = out.hidden[i == cfg.n_layers ? cfg.n_layers + 1 : i];
            testing::Diff d;
            EXPECT_TRUE(
                close(fmt::format("{} hidden_states_{}{}", f.dir, i, sfx), rows_of(mine, row0, len),
                      f.ref->get(fmt::format("hidden_states_{}{}", i, sfx)), kTolerance, &d));
            worst = std::max(worst, d.rel);
        }
        testing::Diff d;
        EXPECT_TRUE(close(f.dir + " logits" + sfx, out.logits[r], f.ref->get("logits" + sfx),
                          kTolerance, &d));
        worst = std::max(worst, d.rel);
        // Indexer selections, compared as sets per query.
        for (int li = 0; li < cfg.n_layers; ++li) {
            const std::string name = fmt::format("indexer_topk_{}{}", li, sfx);
            if (cfg.layer_types[li] != AttnType::CSA) continue;
            ASSERT_TRUE(f.ref->has(name)) << name;
            Tensor ref = f.ref->get(name);
            int64_t mismatches = 0;
            for (int64_t t = 0; t < len; ++t)
                if (testing::topk_sets_differ(ref, out.topk[li], row0, t) && mismatches++ < 3)
                    ADD_FAILURE() << name << " query " << t << ": HF's and our selections differ";
            EXPECT_EQ(mismatches, 0) << name;
        }
        // Router choices (PrefillOutput::routes), compared as sets per token.
        for (int li = 0; li < cfg.n_layers; ++li) {
            const std::string name = fmt::format("router_indices_{}{}", li, sfx);
            if (!f.ref->has(name)) continue;
            const Tensor ref = f.ref->get(name);
            ASSERT_EQ(ref.numel(), len * cfg.top_k) << name;
            const auto id = [](const Tensor& t, int64_t i) {
                return t.dtype() == DType::I64 ? t.data<int64_t>()[i]
                                               : int64_t{t.data<int32_t>()[i]};
            };
            int64_t mismatches = 0;
            for (int64_t t = 0; t < len; ++t) {
                std::vector<int64_t> a, b;
                for (int k = 0; k < cfg.top_k; ++k) {
                    a.push_back(out.routes[li].data<int32_t>()[(row0 + t) * cfg.top_k + k]);
                    b.push_back(id(ref, t * cfg.top_k + k));
                }
                std::sort(a.begin(), a.end());
                std::sort(b.begin(), b.end());
                if (a != b && mismatches++ < 3)
                    ADD_FAILURE() << name << " token " << t << ": HF's and our experts differ";
            }
            EXPECT_EQ(mismatches, 0) << name;
        }
    }
    RecordProperty("worst_relative_error", fmt::format("{:.3g}", worst));
    std::printf("[ golden ] %s: worst relative error %.3g over hidden states and logits\n",
                f.dir.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(golden_fixtures()),
                         [](const auto& info) {
                             std::string n = info.param.substr(info.param.rfind('/') + 1);
                             for (char& c : n)
                                 if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

TEST(GoldenData, FixturesArePresent) { EXPECT_GE(golden_fixtures().size(), 2u); }

}  // namespace
}  // namespace cpfill
