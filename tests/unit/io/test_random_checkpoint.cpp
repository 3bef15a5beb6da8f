// Random checkpoints: deterministic values with the intended statistics, and every
// (naming × dtype × expert format) written by write_random_checkpoint loads back through
// Checkpoint to exactly the stored values: f32 as generated, bf16 rounded, fp8 / fp4 equal to
// dequantize(quantize(w)) of the same generated weights and within quantisation error of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/quant.h"
#include "io/random_checkpoint.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

constexpr uint64_t kSeed = 1234;

struct Stats {
    double mean = 0, std = 0;
};

Stats stats(const Tensor& t) {
    double s = 0, s2 = 0;
    const float* p = t.f32();
    for (int64_t i = 0; i < t.numel(); ++i) {
        s += p[i];
        s2 += double{p[i]} * p[i];
    }
    const double n = static_cast<double>(t.numel());
    return {s / n, std::sqrt(std::max(0.0, s2 / n - (s / n) * (s / n)))};
}

// Max abs difference, with the worst index, for failure messages.
std::string compare(const Tensor& a, const Tensor& b, double* max_abs) {
    *max_abs = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
        const double d = std::fabs(double{a.f32()[i]} - b.f32()[i]);
        if (d > *max_abs || std::isnan(d)) {
            *max_abs = std::isnan(d) ? INFINITY : d;
            worst = i;
        }
    }
    return fmt::format("max abs {} at {} (actual {}, expected {})", *max_abs, worst,
                       a.numel() ? a.f32()[worst] : 0.f, b.numel() ? b.f32()[worst] : 0.f);
}

void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& what) {
    ASSERT_EQ(actual.dtype(), DType::F32) << what;
    ASSERT_EQ(actual.shape(), expected.shape()) << what;
    double max_abs;
    std::string msg = compare(actual, expected, &max_abs);
    EXPECT_EQ(max_abs, 0.0) << what << ": " << msg << " (seed " << kSeed << ")";
}

TEST(RandomWeight, DeterministicAndThreadIndependent) {
    const ModelConfig cfg = preset_config("tiny");
    const WeightSpecTable t(cfg);
    const WeightSpec& s = t.at("layers.1.attn.wq_b.weight");  // 262144 values
    Tensor a = random_weight(cfg, s, kSeed, 1), b = random_weight(cfg, s, kSeed, 2);
    expect_equal(a, b, s.name);
    Tensor c = random_weight(cfg, s, kSeed + 1, 1);
    EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
    Tensor d = random_weight(cfg, t.at("layers.3.attn.wq_b.weight"), kSeed, 1);
    EXPECT_NE(std::memcmp(a.raw(), d.raw(), a.nbytes()), 0);  // seeded by name
}

TEST(RandomWeight, Distributions) {
    const ModelConfig cfg = preset_config("tiny");
    const WeightSpecTable t(cfg);
    auto st = [&](const char* name) { return stats(random_weight(cfg, t.at(name), kSeed, 2)); };
    Stats lin = st("layers.1.attn.wq_b.weight");  // fan_in = q_rank = 128
    EXPECT_NEAR(lin.mean, 0.0, 0.01);
    EXPECT_NEAR(lin.std, 1.0 / std::sqrt(128.0), 0.005);
    Stats emb = st("embed.weight");
    EXPECT_NEAR(emb.std, 1.0, 0.02);
    Stats norm = st("layers.0.attn_norm.weight");
    EXPECT_NEAR(norm.mean, 1.0, 0.03);
    EXPECT_NEAR(norm.std, 0.1, 0.02);
    Stats ape = st("layers.2.attn.compressor.ape");
    EXPECT_NEAR(ape.std, 0.5, 0.05);

    Tensor ids = random_weight(cfg, t.at("layers.0.ffn.gate.tid2eid"), kSeed, 2);
    ASSERT_EQ(ids.dtype(), DType::I64);
    ASSERT_EQ(ids.shape(), (Shape{cfg.vocab_size, cfg.top_k}));
    std::set<int64_t> used;
    for (int64_t r = 0; r < ids.dim(0); ++r) {
        const int64_t* row = ids.data<int64_t>() + r * cfg.top_k;
        std::set<int64_t> distinct(row, row + cfg.top_k);
        EXPECT_EQ(distinct.size(), static_cast<size_t>(cfg.top_k)) << "row " << r;
        for (int64_t e : distinct) {
            EXPECT_GE(e, 0);
            EXPECT_LT(e, cfg.n_experts);
            used.insert(e);
        }
    }
    EXPECT_EQ(used.size(), static_cast<size_t>(cfg.n_experts));
}

// What the checkpoint must hold for `spec`, given the options it was written with.
Tensor expected_value(const ModelConfig& cfg, const WeightSpec& spec,
                      const RandomCheckpointOptions& o, Naming naming) {
    Tensor w = random_weight(cfg, spec, o.seed, 2);
    const bool fp4 = spec.cls == WeightClass::Fp4Expert && o.experts == "fp4";
    if (fp4) {
        QuantizedWeight q = quantize_fp4_block32(w);
        return dequantize_fp4_block32(q.weight, q.scale);
    }
    if (o.dtype == "f32" || spec.cls == WeightClass::F32) return w;
    const bool fp8 = o.dtype == "fp8" &&
                     (spec.cls == WeightClass::Fp8Linear || spec.cls == WeightClass::Fp4Expert);
    if (!fp8) return to_f32(f32_to_bf16_tensor(w));
    if (naming == Naming::HfModule && spec.expert >= 0 &&
        spec.name.find(".w2.") == std::string::npos) {
        // Stacked gate_up_proj: w1 and w3 share the 128×128 tiles of [w1; w3].
        const std::string p =
            spec.name.substr(0, spec.name.size() - std::string("w1.weight").size());
        const WeightSpecTable t(cfg);
        Tensor w1 = random_weight(cfg, t.at(p + "w1.weight"), o.seed, 2);
        Tensor w3 = random_weight(cfg, t.at(p + "w3.weight"), o.seed, 2);
        Tensor both = Tensor::empty(DType::F32, {2 * w1.dim(0), w1.dim(1)});
        std::memcpy(both.f32(), w1.f32(), w1.nbytes());
        std::memcpy(both.f32() + w1.numel(), w3.f32(), w3.nbytes());
        QuantizedWeight q = quantize_fp8_block128(both);
        Tensor d = dequantize_fp8_block128(q.weight, q.scale);
        Tensor out = Tensor::empty(DType::F32, w1.shape());
        const bool second = spec.name.ends_with("w3.weight");
        std::memcpy(out.f32(), d.f32() + (second ? w1.numel() : 0), out.nbytes());
        return out;
    }
    QuantizedWeight q = quantize_fp8_block128(w);
    return dequantize_fp8_block128(q.weight, q.scale);
}

struct Variant {
    const char* names;
    const char* dtype;
    const char* experts;
    Naming naming;
};

class RandomCheckpointLoad : public ::testing::TestWithParam<Variant> {};

TEST_P(RandomCheckpointLoad, EveryWeightMatches) {
    const Variant v = GetParam();
    const ModelConfig cfg = preset_config("tiny");
    test::TempDir dir;
    RandomCheckpointOptions o;
    o.seed = kSeed;
    o.names = v.names;
    o.dtype = v.dtype;
    o.experts = v.experts;
    o.threads = 2;
    write_random_checkpoint(cfg, dir.path().string(), o);
    Checkpoint ck(dir.path().string());
    EXPECT_EQ(ck.naming(), naming_name(v.naming));
    EXPECT_EQ(ck.config().layer_types, cfg.layer_types);
    EXPECT_EQ(ck.config().mlp_types, cfg.mlp_types);
    ck.validate();
    EXPECT_TRUE(ck.unused_tensors().empty());
    for (const WeightSpec& s : ck.specs().all()) {
        if (s.cls == WeightClass::I64) {
            Tensor ids = ck.get_i64(s.name), want = random_weight(cfg, s, kSeed, 2);
            EXPECT_EQ(std::memcmp(ids.raw(), want.raw(), want.nbytes()), 0) << s.name;
            continue;
        }
        expect_equal(ck.get_f32(s.name), expected_value(cfg, s, o, v.naming), s.name);
    }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, RandomCheckpointLoad,
                         ::testing::Values(Variant{"hf", "f32", "same", Naming::HfSaved},
                                           Variant{"upstream", "f32", "same", Naming::Upstream},
                                           Variant{"hf-module", "f32", "same", Naming::HfModule},
                                           Variant{"hf", "bf16", "same", Naming::HfSaved},
                                           Variant{"upstream", "bf16", "fp4", Naming::Upstream},
                                           Variant{"upstream", "fp8", "fp4", Naming::Upstream},
                                           Variant{"hf", "fp8", "same", Naming::HfSaved},
                                           Variant{"hf-module", "fp8", "fp4", Naming::HfModule},
                                           Variant{"hf-module", "fp8", "same", Naming::HfModule}),
                         [](const auto& info) {
                             std::string n = std::string(info.param.names) + "_" +
                                             info.param.dtype + "_" + info.param.experts;
                             for (char& ch : n)
                                 if (ch == '-') ch = '_';
                             return n;
                         });

// The quantised checkpoint is within quantisation error of the f32 one with the same seed.
TEST(RandomCheckpoint, QuantisedIsCloseToF32) {
    const ModelConfig cfg = preset_config("tiny");
    test::TempDir d32, d8;
    RandomCheckpointOptions o;
    o.seed = kSeed;
    o.names = "upstream";
    write_random_checkpoint(cfg, d32.path().string(), o);
    o.dtype = "fp8";
    o.experts = "fp4";
    write_random_checkpoint(cfg, d8.path().string(), o);
    Checkpoint a(d32.path().string()), b(d8.path().string());
    for (const char* name : {"layers.1.attn.wq_b.weight", "layers.1.ffn.experts.3.w2.weight",
                             "layers.2.attn.compressor.wkv.weight", "embed.weight"}) {
        Tensor w = a.get_f32(name), q = b.get_f32(name);
        double err2 = 0, ref2 = 0;
        for (int64_t i = 0; i < w.numel(); ++i) {
            err2 += std::pow(double{q.f32()[i]} - w.f32()[i], 2);
            ref2 += std::pow(double{w.f32()[i]}, 2);
        }
        const double rel = std::sqrt(err2 / ref2);
        // e4m3 keeps 3 mantissa bits (≤ 2^-4 relative rounding), e2m1 1 bit with a per-32 scale
        // (≈ 10% RMS on Gaussian data), bf16 8 bits.
        const double tol = std::string(name).find("experts") != std::string::npos ? 0.15 : 0.05;
        EXPECT_LT(rel, tol) << name;
        EXPECT_GT(rel, 0.0) << name;
    }
}

TEST(RandomCheckpoint, ShardsWithIndexLoadTheSame) {
    const ModelConfig cfg = preset_config("tiny");
    test::TempDir one, many;
    RandomCheckpointOptions o;
    o.seed = kSeed;
    o.dtype = "bf16";
    write_random_checkpoint(cfg, one.path().string(), o);
    o.max_shard_bytes = 1 << 20;
    write_random_checkpoint(cfg, many.path().string(), o);
    EXPECT_TRUE(std::filesystem::exists(one.path() / "model.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(many.path() / "model.safetensors.index.json"));
    int shards = 0;
    for (const auto& e : std::filesystem::directory_iterator(many.path()))
        shards += e.path().filename().string().starts_with("model-");
    EXPECT_GT(shards, 2);
    Checkpoint a(one.path().string()), b(many.path().string());
    for (const WeightSpec& s : a.specs().all())
        if (s.cls != WeightClass::I64) expect_equal(b.get_f32(s.name), a.get_f32(s.name), s.name);
    // Rewriting a folder replaces the old shards instead of mixing them in.
    o.max_shard_bytes = size_t{1} << 30;
    write_random_checkpoint(cfg, many.path().string(), o);
    EXPECT_FALSE(std::filesystem::exists(many.path() / "model.safetensors.index.json"));
    Checkpoint c(many.path().string());
    EXPECT_TRUE(c.unused_tensors().empty());
}

TEST(RandomCheckpoint, RowSlicesMatchTheWholeTensor) {
    const ModelConfig cfg = preset_config("tiny");
    for (const char* names : {"upstream", "hf-module"}) {
        test::TempDir dir;
        RandomCheckpointOptions o;
        o.seed = kSeed;
        o.names = names;
        o.dtype = "fp8";
        o.experts = "fp4";
        write_random_checkpoint(cfg, dir.path().string(), o);
        Checkpoint ck(dir.path().string());
        for (const char* name :
             {"layers.1.attn.wq_b.weight", "layers.0.ffn.experts.5.w3.weight",
              "layers.0.ffn.experts.5.w2.weight", "embed.weight", "layers.1.attn.compressor.ape"}) {
            Tensor whole = ck.get_f32(name);
            for (auto [b, e] : {std::pair<int64_t, int64_t>{5, 133}, {0, 1}, {128, 256}, {3, 3}}) {
                if (e > whole.dim(0)) continue;
                Tensor part = ck.get_f32_rows(name, b, e);
                ASSERT_EQ(part.dim(0), e - b);
                const int64_t row = whole.numel() / whole.dim(0);
                Tensor want = Tensor::empty(DType::F32, part.shape());
                std::memcpy(want.f32(), whole.f32() + b * row, want.nbytes());
                expect_equal(part, want, fmt::format("{} {} rows [{}, {})", names, name, b, e));
            }
        }
        test::expect_error([&] { ck.get_f32_rows("embed.weight", 10, 5000); },
                           {"embed.weight", "out of range"});
    }
}

TEST(RandomCheckpoint, ConfigFiles) {
    const ModelConfig cfg = preset_config("tiny");
    test::TempDir dir;
    RandomCheckpointOptions o;
    o.dtype = "fp8";
    o.experts = "fp4";
    write_random_checkpoint(cfg, dir.path().string(), o);
    auto j = nlohmann::json::parse(std::ifstream(dir.file("config.json")));
    EXPECT_EQ(j["model_type"], "deepseek_v4");
    EXPECT_EQ(j["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
    EXPECT_EQ(j["expert_dtype"], "fp4");
    test::expect_error(
        [&] {
            RandomCheckpointOptions bad;
            bad.dtype = "int4";
            write_random_checkpoint(cfg, dir.path().string(), bad);
        },
        {"int4"});
}

}  // namespace
}  // namespace cpfill
