// load_rank_weights (parallel, per-rank expert slices read directly) gives bit for bit what
// slice_experts(load_weights(ck), {r, C}) gives, for random "tiny" checkpoints stored in f32,
// bf16 and fp8 with fp4 experts, in the flat and the stacked (hf-module) naming, for C in
// {1, 2, 3}; plus a tiny variant whose expert width (300) makes the slices cut through fp8 tiles,
// fp4 scale blocks and packed bytes. Dense tensors are shared by the ranks, not copied.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <bit>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "../io/io_test_util.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "io/safetensors.h"
#include "io/weight_specs.h"
#include "model/weights.h"

namespace cpfill {
namespace {

constexpr uint64_t kSeed = 11;

struct Param {
    std::string dtype, experts, names;
    int64_t moe_dim;  // 0: the preset's
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    const Param& p = info.param;
    std::string n = fmt::format("{}_{}_{}_moe{}", p.dtype, p.experts, p.names, p.moe_dim);
    for (char& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
}

// One checkpoint per parameter, written once and kept for the whole run.
struct Stored {
    test::TempDir dir;
    std::unique_ptr<Checkpoint> ck;
    ModelWeights full;  // load_weights: the reference
};

const Stored& stored(const Param& p) {
    static std::mutex mu;
    static std::map<std::string, std::unique_ptr<Stored>> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto& s = cache[fmt::format("{}/{}/{}/{}", p.dtype, p.experts, p.names, p.moe_dim)];
    if (!s) {
        s = std::make_unique<Stored>();
        ModelConfig cfg = preset_config("tiny");
        if (p.moe_dim) cfg.moe_dim = p.moe_dim;
        RandomCheckpointOptions o;
        o.seed = kSeed;
        o.dtype = p.dtype;
        o.experts = p.experts;
        o.names = p.names;
        o.threads = 2;
        write_random_checkpoint(cfg, s->dir.path().string(), o);
        s->ck = std::make_unique<Checkpoint>(s->dir.path().string());
        s->full = load_weights(*s->ck);
    }
    return *s;
}

// Every tensor of a rank's weights with a name, in a fixed order.
std::vector<std::pair<std::string, const Tensor*>> tensors(const ModelWeights& w) {
    std::vector<std::pair<std::string, const Tensor*>> out = {{"embed", &w.embed},
                                                              {"head", &w.head},
                                                              {"norm", &w.norm},
                                                              {"hc_head_fn", &w.hc_head_fn},
                                                              {"hc_head_base", &w.hc_head_base},
                                                              {"hc_head_scale", &w.hc_head_scale}};
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const LayerWeights& L = w.layers[i];
        const AttentionWeights& a = L.attn;
        const MoeWeights& m = L.moe;
        const std::vector<std::pair<const char*, const Tensor*>> named = {
            {"hc_attn.fn", &L.hc_attn.fn},
            {"hc_attn.base", &L.hc_attn.base},
            {"hc_attn.scale", &L.hc_attn.scale},
            {"hc_ffn.fn", &L.hc_ffn.fn},
            {"hc_ffn.base", &L.hc_ffn.base},
            {"hc_ffn.scale", &L.hc_ffn.scale},
            {"attn_norm", &L.attn_norm},
            {"ffn_norm", &L.ffn_norm},
            {"wq_a", &a.wq_a},
            {"q_norm", &a.q_norm},
            {"wq_b", &a.wq_b},
            {"wkv", &a.wkv},
            {"kv_norm", &a.kv_norm},
            {"wo_a", &a.wo_a},
            {"wo_b", &a.wo_b},
            {"sink", &a.sink},
            {"compressor.wkv", &a.compressor.wkv},
            {"compressor.wgate", &a.compressor.wgate},
            {"compressor.ape", &a.compressor.ape},
            {"compressor.norm", &a.compressor.norm},
            {"idx_wq_b", &a.idx_wq_b},
            {"idx_weights_proj", &a.idx_weights_proj},
            {"idx_compressor.wkv", &a.idx_compressor.wkv},
            {"idx_compressor.wgate", &a.idx_compressor.wgate},
            {"idx_compressor.ape", &a.idx_compressor.ape},
            {"idx_compressor.norm", &a.idx_compressor.norm},
            {"gate", &m.gate},
            {"gate_bias", &m.gate_bias},
            {"tid2eid", &m.tid2eid},
            {"shared_w13", &m.shared_w13},
            {"shared_w2", &m.shared_w2}};
        for (const auto& [n, t] : named) out.emplace_back(fmt::format("layers.{}.{}", i, n), t);
        for (size_t e = 0; e < m.w13.size(); ++e) {
            out.emplace_back(fmt::format("layers.{}.w13[{}]", i, e), &m.w13[e]);
            out.emplace_back(fmt::format("layers.{}.w2[{}]", i, e), &m.w2[e]);
        }
    }
    return out;
}

// Same dtype, shape and bytes; on a mismatch, the first differing element.
void expect_identical(const Tensor& got, const Tensor& want, const std::string& what) {
    ASSERT_EQ(got.raw() == nullptr, want.raw() == nullptr) << what << ": loaded in one only";
    if (!got.raw()) return;  // absent in both (no compressor on a sliding layer, ...)
    ASSERT_EQ(got.dtype(), want.dtype()) << what;
    ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
    if (std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0) return;
    ASSERT_EQ(got.dtype(), DType::F32) << what << ": integer tensors differ";
    for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got.f32()[i]), std::bit_cast<uint32_t>(want.f32()[i]))
            << what << " differs first at element " << i << ": " << got.f32()[i] << " vs "
            << want.f32()[i];
}

class LoadRankWeights : public ::testing::TestWithParam<Param> {};

TEST_P(LoadRankWeights, BitIdenticalToSlicedFullLoad) {
    const Stored& s = stored(GetParam());
    for (int C : {1, 2, 3}) {
        for (int threads : {1, 2}) {
            SCOPED_TRACE(fmt::format("seed {}, cp_size {}, {} threads", kSeed, C, threads));
            LoadStats stats;
            std::vector<ModelWeights> ranks = load_rank_weights(*s.ck, C, {threads, false}, &stats);
            ASSERT_EQ(ranks.size(), static_cast<size_t>(C));
            EXPECT_GT(stats.stored_bytes, 0u);
            for (int r = 0; r < C; ++r) {
                SCOPED_TRACE(fmt::format("rank {}", r));
                const ModelWeights want = slice_experts(s.full, {r, C});
                EXPECT_EQ(ranks[r].slice.part, r);
                EXPECT_EQ(ranks[r].slice.parts, C);
                EXPECT_EQ(ranks[r].bytes(), want.bytes());
                const auto got_t = tensors(ranks[r]), want_t = tensors(want);
                ASSERT_EQ(got_t.size(), want_t.size());
                for (size_t i = 0; i < got_t.size(); ++i)
                    expect_identical(*got_t[i].second, *want_t[i].second, got_t[i].first);
            }
            // Dense tensors are shared by all ranks; experts are each rank's own.
            for (int r = 1; r < C; ++r) {
                EXPECT_EQ(ranks[r].embed.raw(), ranks[0].embed.raw());
                EXPECT_EQ(ranks[r].layers[1].attn.wq_b.raw(), ranks[0].layers[1].attn.wq_b.raw());
                EXPECT_NE(ranks[r].layers[1].moe.w2[0].raw(), ranks[0].layers[1].moe.w2[0].raw());
            }
            // fp32 produced: the dense tensors once and every rank's experts (bytes() counts
            // every weight a rank holds, tid2eid's int64 too).
            size_t f32 = ranks[0].bytes();
            for (const LayerWeights& L : ranks[0].layers)
                if (L.moe.tid2eid.defined()) f32 -= L.moe.tid2eid.nbytes();
            for (int r = 1; r < C; ++r) {
                for (const LayerWeights& L : ranks[r].layers) {
                    f32 += L.moe.shared_w13.nbytes() + L.moe.shared_w2.nbytes();
                    for (const Tensor& t : L.moe.w13) f32 += t.nbytes();
                    for (const Tensor& t : L.moe.w2) f32 += t.nbytes();
                }
            }
            EXPECT_EQ(stats.f32_bytes, f32);
        }
    }
}

// The table's slots: every weight of the table lands in its own tensor of the shape the table
// gives (an expert's w1 and w3 together in [w1; w3]), and nothing the CPU backend holds is left
// out: bytes() equals the table's count.
TEST(LoadRankWeights, EveryTableWeightHasItsOwnTensor) {
    const Stored& s = stored({"fp8", "fp4", "upstream", 300});
    ModelWeights w = s.full;
    std::map<const Tensor*, std::string> seen;
    size_t table_bytes = 0;
    for (const WeightSpec& spec : s.ck->specs().all()) {
        SCOPED_TRACE(spec.name);
        const Tensor* t = tensor_slot(w, spec);
        ASSERT_NE(t, nullptr);
        ASSERT_TRUE(t->defined());
        Shape want = spec.shape;
        if (spec.slot == WeightSlot::W1 || spec.slot == WeightSlot::W3) want[0] *= 2;
        EXPECT_EQ(shape_str(t->shape()), shape_str(want));
        const auto [it, fresh] = seen.emplace(t, spec.name);
        const bool w3_of_w1 =
            spec.slot == WeightSlot::W3 && it->second.substr(0, it->second.size() - 9) ==
                                               spec.name.substr(0, spec.name.size() - 9);
        EXPECT_TRUE(fresh || w3_of_w1) << "shares a tensor with " << it->second;
        if (spec.slot != WeightSlot::W3)
            table_bytes += static_cast<size_t>(t->numel()) * (spec.cls == WeightClass::I64 ? 8 : 4);
    }
    EXPECT_EQ(w.bytes(), table_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, LoadRankWeights,
    ::testing::Values(Param{"f32", "same", "hf", 0}, Param{"bf16", "same", "upstream", 0},
                      Param{"fp8", "fp4", "upstream", 0}, Param{"fp8", "fp4", "hf-module", 0},
                      Param{"fp8", "same", "hf-module", 300}, Param{"fp8", "fp4", "upstream", 300}),
    param_name);

TEST(LoadRankWeights, OnlySomeRanksEqualTheirFullLoad) {
    const Stored& s = stored({"fp8", "fp4", "upstream", 300});
    const std::vector<int> only = {2, 0};
    LoadStats some, all;
    const std::vector<ModelWeights> got = load_rank_weights(*s.ck, 3, {2, false}, &some, only);
    const std::vector<ModelWeights> full = load_rank_weights(*s.ck, 3, {2, false}, &all);
    ASSERT_EQ(got.size(), 2u);
    for (size_t k = 0; k < got.size(); ++k) {
        const int r = only[k];
        SCOPED_TRACE(fmt::format("rank {}", r));
        EXPECT_EQ(got[k].slice.part, r);
        EXPECT_EQ(got[k].slice.parts, 3);
        const auto got_t = tensors(got[k]), want_t = tensors(full[r]);
        ASSERT_EQ(got_t.size(), want_t.size());
        for (size_t i = 0; i < got_t.size(); ++i)
            expect_identical(*got_t[i].second, *want_t[i].second, got_t[i].first);
    }
    EXPECT_LT(some.f32_bytes, all.f32_bytes);  // rank 1's experts were never produced
    test::expect_error(
        [&] {
            load_rank_weights(*s.ck, 3, {1, false}, nullptr, {3});
        },
        {"rank 3", "group of 3"});
}

TEST(LoadRankWeightsErrors, MoreRanksThanExpertUnits) {
    const Stored& s = stored({"f32", "same", "hf", 0});
    test::expect_error(
        [&] {
            load_rank_weights(*s.ck, 129, {1, false});
        },
        {"moe_intermediate_size 128", "129 ranks"});
    test::expect_error([&] { load_rank_weights(*s.ck, 0, {1, false}); }, {"0 ranks"});
}

// The count the memory check uses is exactly what a load allocates: the planned fp32 bytes plus
// the int64 tid2eid tables, for every rank and for a subset (slices of unequal width: 300 / 3 ranks
// is even, 300 / 7 is not).
TEST(LoadRankWeights, HostBytesAreWhatTheLoadAllocates) {
    const Stored& s = stored({"fp8", "fp4", "upstream", 300});
    const ModelConfig& cfg = s.ck->config();
    for (const auto& [cp, only] : std::vector<std::pair<int, std::vector<int>>>{
             {1, {}}, {3, {}}, {3, {2, 0}}, {7, {6}}, {7, {}}}) {
        SCOPED_TRACE(fmt::format("cp {} ranks {}", cp, fmt::join(only, ",")));
        LoadStats stats;
        const std::vector<ModelWeights> got =
            load_rank_weights(*s.ck, cp, {2, false}, &stats, only);
        size_t i64 = 0;
        for (const LayerWeights& L : got[0].layers)
            if (L.moe.tid2eid.defined()) i64 += L.moe.tid2eid.nbytes();
        EXPECT_GT(i64, 0u);
        std::vector<int> ranks = only;
        if (ranks.empty())
            for (int r = 0; r < cp; ++r) ranks.push_back(r);
        EXPECT_EQ(rank_weights_host_bytes(cfg, cp, ranks), stats.f32_bytes + i64);
    }
}

// The CUDA backend loads the top-level tensors, then one layer at a time
// (load_rank_weights_in_parts): put together, the parts are the whole load bit for bit, each part
// holds nothing else, and the parts' byte counts add up to the whole's.
TEST(LoadRankWeights, PartsMakeUpTheWholeLoad) {
    const Stored& s = stored({"fp8", "fp4", "upstream", 300});
    const ModelConfig& cfg = s.ck->config();
    const std::vector<int> only = {2, 0};
    LoadStats whole_stats;
    const std::vector<ModelWeights> whole =
        load_rank_weights(*s.ck, 3, {2, false}, &whole_stats, only);

    LoadOptions opt(2, false);
    std::vector<ModelWeights> assembled;
    std::vector<int> order;
    size_t host_sum = 0, most = 0;
    const LoadStats stats = load_rank_weights_in_parts(
        *s.ck, 3, opt, only, [&](int part, const std::vector<ModelWeights>& ranks) {
            order.push_back(part);
            const LoadPart p = part < 0 ? LoadPart{true, 0, 0} : LoadPart{false, part, part + 1};
            host_sum += rank_weights_host_bytes(cfg, 3, only, p);
            most = std::max(most, rank_weights_host_bytes(cfg, 3, only, p));
            ASSERT_EQ(ranks.size(), only.size());
            EXPECT_EQ(ranks[1].slice.part, 0);
            if (part < 0) {
                assembled = ranks;
                for (const LayerWeights& L : ranks[0].layers) {
                    EXPECT_FALSE(L.attn.wq_a.defined());
                    EXPECT_TRUE(L.moe.w13.empty());
                }
                return;
            }
            EXPECT_FALSE(ranks[0].embed.defined());
            for (int other = 0; other < cfg.n_layers; ++other) {
                if (other != part) {
                    EXPECT_FALSE(ranks[1].layers[other].attn.wq_a.defined());
                }
            }
            for (size_t k = 0; k < ranks.size(); ++k)
                assembled[k].layers[part] = ranks[k].layers[part];
        });
    std::vector<int> want_order;
    for (int part = -1; part < cfg.n_layers; ++part) want_order.push_back(part);
    EXPECT_EQ(order, want_order);
    const size_t stored_sum = stats.stored_bytes;
    for (size_t k = 0; k < only.size(); ++k) {
        const auto got = tensors(assembled[k]), want = tensors(whole[k]);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
            expect_identical(*got[i].second, *want[i].second, got[i].first);
    }
    EXPECT_EQ(stored_sum, whole_stats.stored_bytes);
    EXPECT_EQ(host_sum, rank_weights_host_bytes(cfg, 3, only));
    EXPECT_EQ(streamed_load_host_bytes(cfg, 3, only), most);
    EXPECT_LT(most, host_sum / 2);
    // The progress total estimate is the stored bytes read, up to the rounding of fp8 tile shares.
    const double est = static_cast<double>(rank_weights_stored_bytes(*s.ck, 3, only));
    EXPECT_NEAR(est, static_cast<double>(whole_stats.stored_bytes), 0.01 * est);
    // A part that does not fit is named in the refusal.
    opt.part = {false, 2, 3};
    opt.host_memory = rank_weights_host_bytes(cfg, 3, only, opt.part) - 1;
    test::expect_error([&] { load_rank_weights(*s.ck, 3, opt, nullptr, only); },
                       {"out of host memory", "(layer 2)", "2 ranks of --cp 3", "under mpirun"});
}

TEST(LoadRankWeightsErrors, NotEnoughHostMemoryIsRefusedBeforeLoading) {
    const Stored& s = stored({"f32", "same", "hf", 0});
    const ModelConfig& cfg = s.ck->config();
    const size_t need = rank_weights_host_bytes(cfg, 2, {0, 1});
    LoadOptions opt{1, false, need - 1};
    LoadStats stats;
    test::expect_error(
        [&] { load_rank_weights(*s.ck, 2, opt, &stats); },
        {"out of host memory", "all 2 ranks of --cp 2", fmt::format("need {:.2f} GB", need * 1e-9),
         fmt::format("{:.2f} GB are available", (need - 1) * 1e-9), "--device cuda"});
    EXPECT_EQ(stats.stored_bytes, 0u);  // nothing was read
    // One rank of the two (as under mpirun) needs less: the dense tensors and half the experts.
    opt.host_memory = rank_weights_host_bytes(cfg, 2, {1});
    EXPECT_LT(*opt.host_memory, need);
    EXPECT_EQ(load_rank_weights(*s.ck, 2, opt, nullptr, {1}).size(), 1u);
    opt.host_memory = *opt.host_memory - 1;
    test::expect_error([&] { load_rank_weights(*s.ck, 2, opt, nullptr, {0}); },
                       {"out of host memory", "rank 0 of --cp 2"});
}

TEST(LoadRankWeightsErrors, MissingExpertTensorIsNamed) {
    test::TempDir dir;
    RandomCheckpointOptions o;
    o.names = "upstream";
    o.threads = 2;
    write_random_checkpoint(preset_config("tiny"), dir.path().string(), o);
    std::vector<std::pair<std::string, Tensor>> kept;
    {
        SafetensorsSet set(dir.path().string());
        for (const std::string& n : set.names())
            if (n != "layers.2.ffn.experts.5.w2.weight") kept.emplace_back(n, set.get(n).clone());
    }
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
        if (e.path().extension() == ".safetensors") std::filesystem::remove(e.path());
    write_safetensors(dir.file("model.safetensors"), kept);
    Checkpoint ck(dir.path().string());
    test::expect_error(
        [&] {
            load_rank_weights(ck, 2, {2, false});
        },
        {"layers.2.ffn.experts.5.w2.weight", "missing"});
}

}  // namespace
}  // namespace cpfill
