// Checkpoint errors and edge cases on doctored random checkpoints: a missing tensor, a wrong
// shape, a wrong dtype, a missing or misshaped block scale each fail naming the tensor, what was
// expected and what was found; tied heads, I32 tid2eid, F32 block scales and unused tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/quant.h"
#include "io/random_checkpoint.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::expect_error;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

// A tiny random checkpoint in a temp folder.
struct Fixture {
    test::TempDir dir;
    explicit Fixture(const char* names = "upstream", const char* dtype = "f32",
                     const char* experts = "same") {
        RandomCheckpointOptions o;
        o.seed = 7;
        o.names = names;
        o.dtype = dtype;
        o.experts = experts;
        o.threads = 2;
        write_random_checkpoint(preset_config("tiny"), path(), o);
    }
    std::string path() const { return dir.path().string(); }

    // Reads every stored tensor (deep copies), lets `edit` change the list, writes it back as one
    // model.safetensors.
    void rewrite(const std::function<void(Tensors&)>& edit) const {
        Tensors ts;
        {
            SafetensorsSet set(path());
            for (const std::string& n : set.names()) ts.emplace_back(n, set.get(n).clone());
        }
        edit(ts);
        for (const auto& e : std::filesystem::directory_iterator(dir.path()))
            if (e.path().filename() != "config.json") std::filesystem::remove(e.path());
        write_safetensors(dir.file("model.safetensors"), ts);
    }
    void replace(const std::string& name, Tensor t) const {
        rewrite([&](Tensors& ts) {
            for (auto& [n, v] : ts)
                if (n == name) v = t;
        });
    }
    void remove(const std::string& name) const {
        rewrite([&](Tensors& ts) {
            std::erase_if(ts, [&](const auto& p) { return p.first == name; });
        });
    }
    void edit_config(const std::function<void(nlohmann::json&)>& edit) const {
        auto j = nlohmann::json::parse(std::ifstream(dir.file("config.json")));
        edit(j);
        test::write_file(dir.file("config.json"), j.dump(2));
    }
};

TEST(Checkpoint, MissingTensorNamesCanonicalAndStoredName) {
    Fixture f("hf");
    f.remove("model.layers.1.attn.wq_a.weight");
    Checkpoint ck(f.path());
    EXPECT_FALSE(ck.has("layers.1.attn.wq_a.weight"));
    expect_error([&] { ck.get_f32("layers.1.attn.wq_a.weight"); },
                 {"layers.1.attn.wq_a.weight", "missing", "\"model.layers.1.attn.wq_a.weight\"",
                  "hf-saved", f.path()});
    expect_error([&] { ck.validate(); }, {"layers.1.attn.wq_a.weight", "missing"});
    EXPECT_NO_THROW(ck.get_f32("layers.1.attn.wq_b.weight"));
}

TEST(Checkpoint, WrongShape) {
    Fixture f;
    f.replace("layers.1.attn.wq_a.weight", Tensor::zeros(DType::F32, {128, 255}));
    Checkpoint ck(f.path());
    expect_error([&] { ck.get_f32("layers.1.attn.wq_a.weight"); },
                 {"layers.1.attn.wq_a.weight", "expected shape [128, 256]", "found [128, 255]"});
}

TEST(Checkpoint, WrongDtypes) {
    Fixture f;
    f.replace("layers.0.ffn.gate.tid2eid", Tensor::zeros(DType::F32, {512, 2}));
    f.replace("layers.1.attn.wq_a.weight", Tensor::zeros(DType::I64, {128, 256}));
    f.replace("layers.1.attn.wq_b.weight", Tensor::zeros(DType::BOOL, {4096, 128}));
    Checkpoint ck(f.path());
    expect_error([&] { ck.get_i64("layers.0.ffn.gate.tid2eid"); },
                 {"layers.0.ffn.gate.tid2eid", "integer dtype", "found dtype F32"});
    expect_error([&] { ck.get_f32("layers.1.attn.wq_a.weight"); },
                 {"layers.1.attn.wq_a.weight", "float or quantised", "found dtype I64"});
    expect_error([&] { ck.get_f32("layers.1.attn.wq_b.weight"); },
                 {"layers.1.attn.wq_b.weight", "unsupported dtype BOOL"});
    expect_error([&] { ck.get_f32("layers.0.ffn.gate.tid2eid"); }, {"get_i64"});
    expect_error([&] { ck.get_i64("layers.1.attn.wkv.weight"); }, {"get_f32"});
}

TEST(Checkpoint, Fp8ScaleMissingOrMisshaped) {
    Fixture f("upstream", "fp8");
    f.remove("layers.1.attn.wq_a.scale");
    f.replace("layers.1.attn.wq_b.scale", Tensor::zeros(DType::F8_E8M0, {32, 2}));
    Checkpoint ck(f.path());
    expect_error([&] { ck.get_f32("layers.1.attn.wq_a.weight"); },
                 {"layers.1.attn.wq_a.weight", "block scale", "layers.1.attn.wq_a.scale"});
    expect_error([&] { ck.get_f32("layers.1.attn.wq_b.weight"); },
                 {"layers.1.attn.wq_b.weight", "expected shape [32, 1]", "found [32, 2]"});
}

TEST(Checkpoint, Fp4PackedShape) {
    Fixture f("upstream", "f32", "fp4");
    f.replace("layers.2.ffn.experts.1.w1.weight", Tensor::zeros(DType::I8, {128, 256}));
    Checkpoint ck(f.path());
    expect_error([&] { ck.get_f32("layers.2.ffn.experts.1.w1.weight"); },
                 {"layers.2.ffn.experts.1.w1.weight", "expected shape [128, 128]", "packed fp4",
                  "found [128, 256]"});
    StoredWeight s = ck.stored("layers.2.ffn.experts.0.w1.weight");
    EXPECT_EQ(s.dtype, DType::I8);
    EXPECT_EQ(s.scale_name, "layers.2.ffn.experts.0.w1.scale");
    EXPECT_EQ(s.bytes, size_t{128 * 256 / 2 + 128 * 256 / 32});
}

TEST(Checkpoint, StackedExpertInfo) {
    Fixture f("hf-module", "fp8");
    Checkpoint ck(f.path());
    EXPECT_EQ(ck.naming(), "hf-module");
    StoredWeight s = ck.stored("layers.3.ffn.experts.6.w3.weight");
    EXPECT_EQ(s.name, "model.layers.3.mlp.experts.gate_up_proj");
    EXPECT_EQ(s.scale_name, "model.layers.3.mlp.experts.gate_up_proj_scale_inv");
    EXPECT_EQ(s.shape, (Shape{8, 256, 256}));
    EXPECT_EQ(s.expert, 6);
    EXPECT_EQ(s.part, StackPart::SecondHalf);
}

TEST(Checkpoint, TiedHead) {
    Fixture f;
    f.remove("head.weight");
    {
        Checkpoint ck(f.path());
        expect_error([&] { ck.get_f32("head.weight"); }, {"head.weight", "missing"});
    }
    f.edit_config([](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
    Checkpoint ck(f.path());
    EXPECT_TRUE(ck.has("head.weight"));
    Tensor head = ck.get_f32("head.weight"), embed = ck.get_f32("embed.weight");
    EXPECT_EQ(std::memcmp(head.raw(), embed.raw(), embed.nbytes()), 0);
}

TEST(Checkpoint, UnusedTensorsAreListed) {
    Fixture f;
    f.rewrite([](Tensors& ts) {
        ts.emplace_back("mtp.0.emb.weight", Tensor::zeros(DType::F32, {2, 2}));
        ts.emplace_back("layers.0.attn.compressor.ape", Tensor::zeros(DType::F32, {4, 4}));
    });
    Checkpoint ck(f.path());
    EXPECT_EQ(ck.unused_tensors(),
              (std::vector<std::string>{"layers.0.attn.compressor.ape", "mtp.0.emb.weight"}));
    ck.validate();
}

TEST(Checkpoint, Int32Tid2eidAndRangeCheck) {
    Fixture f;
    Tensor want;
    {
        Checkpoint ck(f.path());
        want = ck.get_i64("layers.1.ffn.gate.tid2eid");
    }
    Tensor i32 = Tensor::empty(DType::I32, want.shape());
    for (int64_t i = 0; i < want.numel(); ++i)
        i32.data<int32_t>()[i] = static_cast<int32_t>(want.data<int64_t>()[i]);
    f.replace("layers.1.ffn.gate.tid2eid", i32);
    Tensor bad = want.clone();
    bad.data<int64_t>()[5] = 8;  // tiny has 8 experts
    f.replace("layers.0.ffn.gate.tid2eid", bad);
    Checkpoint ck(f.path());
    Tensor got = ck.get_i64("layers.1.ffn.gate.tid2eid");
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0);
    expect_error([&] { ck.get_i64("layers.0.ffn.gate.tid2eid"); },
                 {"layers.0.ffn.gate.tid2eid", "element 5 is 8", "[0, 8)"});
}

TEST(Checkpoint, F32BlockScales) {
    Fixture f("hf-module", "fp8");
    const std::string w = "model.layers.1.self_attn.q_b_proj.weight";
    Tensor want;
    Tensor scale32;
    {
        Checkpoint ck(f.path());
        want = ck.get_f32("layers.1.attn.wq_b.weight");
        SafetensorsSet set(f.path());
        const Tensor s = set.get(w + "_scale_inv");
        scale32 = Tensor::empty(DType::F32, s.shape());
        for (int64_t i = 0; i < s.numel(); ++i)
            scale32.f32()[i] = e8m0_to_f32(s.data<uint8_t>()[i]);
    }
    f.replace(w + "_scale_inv", scale32);
    Checkpoint ck(f.path());
    Tensor got = ck.get_f32("layers.1.attn.wq_b.weight");
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0);
}

TEST(Checkpoint, UnknownNamingAndUnknownWeight) {
    Fixture f;
    f.rewrite([](Tensors& ts) {
        ts.clear();
        ts.emplace_back("foo.bar", Tensor::zeros(DType::F32, {1}));
    });
    expect_error([&] { Checkpoint ck(f.path()); }, {"cannot tell the tensor naming", "foo.bar"});
    Fixture g;
    Checkpoint ck(g.path());
    expect_error([&] { ck.get_f32("layers.0.attn.indexer.wq_b.weight"); },
                 {"layers.0.attn.indexer.wq_b.weight", "not a weight of this model"});
    EXPECT_FALSE(ck.has("layers.0.attn.indexer.wq_b.weight"));
}

TEST(Checkpoint, MissingConfig) {
    Fixture f;
    std::filesystem::remove(f.dir.file("config.json"));
    expect_error([&] { Checkpoint ck(f.path()); }, {"config.json"});
}

}  // namespace
}  // namespace cpfill
