// A NaN or Inf in a stored weight is refused while reading, in every storage format, with the
// canonical tensor, its stored name and file and the index of the first bad element: f32, bf16,
// an fp8 e4m3 NaN code, and an fp4 block whose E8M0 scale is the NaN byte 0xff.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::TempDir;

// Overwrites `bytes` at byte `offset` of stored tensor `name`'s data in a single-file checkpoint.
void patch(const std::string& dir, const std::string& name, size_t offset,
           const std::string& bytes) {
    const std::string file = dir + "/model.safetensors";
    size_t at = 0;
    {
        SafetensorsFile f(file);
        ASSERT_TRUE(f.has(name)) << name;
        const TensorInfo& info = f.tensors().at(name);
        ASSERT_LE(offset + bytes.size(), info.end - info.begin);
        std::ifstream in(file, std::ios::binary);
        uint64_t header = 0;
        in.read(reinterpret_cast<char*>(&header), 8);
        at = 8 + header + info.begin + offset;
    }
    std::fstream out(file, std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(static_cast<std::streamoff>(at));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
}

std::string make(const TempDir& tmp, const std::string& dtype, const std::string& experts) {
    RandomCheckpointOptions o;
    o.names = "upstream";
    o.dtype = dtype;
    o.experts = experts;
    o.seed = 7;
    write_random_checkpoint(preset_config("tiny"), tmp.file("m"), o);
    return tmp.file("m");
}

template <typename T>
std::string bytes_of(T v) {
    std::string s(sizeof v, '\0');
    std::memcpy(s.data(), &v, sizeof v);
    return s;
}

// wq_a is [q_rank 128, d_model 256]; element [3, 17] is number 3·256 + 17.
constexpr int64_t kElement = 3 * 256 + 17;

TEST(CheckpointFinite, F32Nan) {
    TempDir tmp;
    const std::string dir = make(tmp, "f32", "same");
    patch(dir, "layers.1.attn.wq_a.weight", 4 * kElement,
          bytes_of(std::numeric_limits<float>::quiet_NaN()));
    Checkpoint c(dir);
    test::expect_error([&] { c.get_f32("layers.1.attn.wq_a.weight"); },
                       {"layers.1.attn.wq_a.weight", "model.safetensors", "[3, 17]", "nan",
                        "expected a finite value"});
    // Rows and column slices that skip the element read fine; one that holds it does not.
    EXPECT_NO_THROW(c.get_f32_rows("layers.1.attn.wq_a.weight", 4, 128));
    EXPECT_NO_THROW(c.get_f32_cols("layers.1.attn.wq_a.weight", 18, 256));
    test::expect_error([&] { c.get_f32_cols("layers.1.attn.wq_a.weight", 16, 20); }, {"[3, 17]"});
}

TEST(CheckpointFinite, Bf16Inf) {
    TempDir tmp;
    const std::string dir = make(tmp, "bf16", "same");
    patch(dir, "layers.1.attn.wq_a.weight", 2 * kElement, bytes_of(uint16_t{0xff80}));  // -inf
    Checkpoint c(dir);
    test::expect_error([&] { c.get_f32("layers.1.attn.wq_a.weight"); },
                       {"layers.1.attn.wq_a.weight", "BF16", "[3, 17]", "-inf"});
}

TEST(CheckpointFinite, Fp8NanCode) {
    TempDir tmp;
    const std::string dir = make(tmp, "fp8", "same");
    Checkpoint before(dir);
    ASSERT_EQ(before.stored("layers.1.attn.wq_a.weight").dtype, DType::F8_E4M3);
    patch(dir, "layers.1.attn.wq_a.weight", kElement, bytes_of(uint8_t{0x7f}));  // e4m3fn NaN
    Checkpoint c(dir);
    test::expect_error([&] { c.get_f32("layers.1.attn.wq_a.weight"); },
                       {"layers.1.attn.wq_a.weight", "F8_E4M3", "[3, 17]", "nan"});
}

TEST(CheckpointFinite, Fp4NanScale) {
    TempDir tmp;
    const std::string dir = make(tmp, "fp8", "fp4");
    const std::string w = "layers.1.ffn.experts.2.w1.weight";  // [moe_dim 128, d_model 256]
    const StoredWeight s = Checkpoint(dir).stored(w);
    ASSERT_EQ(s.dtype, DType::I8);
    // Scale [128, 8]: row 5, block 3 covers elements [5, 96 … 127].
    patch(dir, s.scale_name, 5 * 8 + 3, bytes_of(uint8_t{0xff}));
    Checkpoint c(dir);
    test::expect_error([&] { c.get_f32(w); }, {w, "[5, 96]", "nan"});
}

TEST(CheckpointFinite, UntouchedCheckpointReadsEverything) {
    TempDir tmp;
    const std::string dir = make(tmp, "fp8", "fp4");
    Checkpoint c(dir);
    for (const WeightSpec& spec : c.specs().all()) {
        if (spec.cls == WeightClass::I64) continue;
        EXPECT_NO_THROW(c.get_f32(spec.name)) << spec.name;
    }
}

}  // namespace
}  // namespace cpfill
