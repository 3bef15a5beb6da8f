// Checkpoint's block reads against io/quant's whole-tensor dequantisation of the stored bytes:
// every weight of random tiny checkpoints (f32, bf16, fp8 with fp8 or fp4 experts) read whole, and
// awkward rectangles (cutting fp8 128×128 tiles, fp4 1×32 blocks and packed bytes) read with
// get_f32_rows, get_f32_cols and read_f32_block, are bit-identical to the matching part of the
// reference. Also the range checks.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/quant.h"
#include "io/random_checkpoint.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

// The whole weight from its stored tensors through io/quant (upstream naming: one stored tensor
// per weight, its scale beside it).
Tensor reference(const Checkpoint& ck, const std::string& name) {
    const StoredWeight s = ck.stored(name);
    const Tensor w = ck.files().get(s.name);
    const Shape& shape = ck.specs().at(name).shape;
    if (s.scale_name.empty()) return to_f32(w).reshaped(shape);
    const Tensor scale = ck.files().get(s.scale_name);
    return s.dtype == DType::F8_E4M3 ? dequantize_fp8_block128(w, scale)
                                     : dequantize_fp4_block32(w, scale);
}

// got [r1 - r0, c1 - c0] == ref[r0:r1, c0:c1] bit for bit (ref seen as 2-D with `cols` columns).
void expect_block(const float* got, const Tensor& ref, int64_t cols, int64_t r0, int64_t r1,
                  int64_t c0, int64_t c1, const std::string& what) {
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
            const float g = got[(r - r0) * (c1 - c0) + (c - c0)], w = ref.f32()[r * cols + c];
            ASSERT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(w))
                << what << " [" << r << ", " << c << "]: " << g << " vs " << w;
        }
}

class CheckpointBlocks : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(CheckpointBlocks, MatchWholeTensorDequantisation) {
    test::TempDir dir;
    ModelConfig cfg = preset_config("tiny");
    cfg.moe_dim = 300;  // expert slices then cross 128-tiles and 32-blocks at odd columns
    RandomCheckpointOptions o;
    o.seed = 5;
    o.names = "upstream";
    o.dtype = GetParam().first;
    o.experts = GetParam().second;
    o.threads = 2;
    write_random_checkpoint(cfg, dir.path().string(), o);
    Checkpoint ck(dir.path().string());
    for (const WeightSpec& spec : ck.specs().all()) {
        if (spec.cls == WeightClass::I64) continue;
        const Tensor ref = reference(ck, spec.name);
        const Tensor whole = ck.get_f32(spec.name);
        ASSERT_EQ(whole.shape(), spec.shape) << spec.name;
        ASSERT_EQ(std::memcmp(whole.raw(), ref.raw(), ref.nbytes()), 0) << spec.name;
        if (spec.shape.size() != 2) continue;
        const int64_t rows = spec.shape[0], cols = spec.shape[1];
        // Rectangles with odd edges inside tiles/blocks; clipped to the weight.
        for (auto [r0, r1, c0, c1] : {std::array<int64_t, 4>{0, 1, 0, cols},
                                      {rows / 3, rows - 1, 33, cols - 1},
                                      {127, 257, 1, 129},
                                      {100, 200, 100, 200},
                                      {rows - 1, rows, cols - 3, cols}}) {
            r0 = std::min(r0, rows);
            r1 = std::min(std::max(r1, r0), rows);
            c0 = std::min(c0, cols);
            c1 = std::min(std::max(c1, c0), cols);
            std::vector<float> got(static_cast<size_t>((r1 - r0) * (c1 - c0)));
            ck.read_f32_block(spec.name, r0, r1, c0, c1, got.data());
            expect_block(got.data(), ref, cols, r0, r1, c0, c1, spec.name + " block");
            const Tensor rs = ck.get_f32_rows(spec.name, r0, r1);
            expect_block(rs.f32(), ref, cols, r0, r1, 0, cols, spec.name + " rows");
            const Tensor cs = ck.get_f32_cols(spec.name, c0, c1);
            expect_block(cs.f32(), ref, cols, 0, rows, c0, c1, spec.name + " cols");
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointBlocks,
                         ::testing::Values(std::pair{"f32", "same"}, std::pair{"bf16", "same"},
                                           std::pair{"fp8", "same"}, std::pair{"fp8", "fp4"}));

TEST(CheckpointBlocksErrors, OutOfRange) {
    test::TempDir dir;
    RandomCheckpointOptions o;
    o.names = "upstream";
    o.threads = 2;
    write_random_checkpoint(preset_config("tiny"), dir.path().string(), o);
    Checkpoint ck(dir.path().string());
    const std::string w2 = "layers.1.ffn.experts.0.w2.weight";  // [256, 128]
    float f = 0;
    test::expect_error([&] { ck.read_f32_block(w2, 0, 1, 127, 129, &f); },
                       {w2, "columns [127, 129)", "[256, 128]"});
    test::expect_error([&] { ck.get_f32_cols(w2, 5, 4); }, {w2, "columns [5, 4)"});
    test::expect_error([&] { ck.get_f32_cols("layers.1.attn_norm.weight", 0, 1); },
                       {"layers.1.attn_norm.weight", "2-D"});
    test::expect_error([&] { ck.read_f32_block("layers.0.ffn.gate.tid2eid", 0, 1, 0, 1, &f); },
                       {"integers"});
}

}  // namespace
}  // namespace cpfill
