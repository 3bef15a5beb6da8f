// The attention's fp8 output for an fp8 wo_a (AttnArgs out_q, ops/cuda/attention.h) and the linear
// that consumes it (fp8_linear_quantised, ops/cuda/fp8_linear.h), both to the bit against the path
// they replace: attention_tc with bf16 output, then fp8_linear's quantisation per wo_a group
// (quantize_act_fp8 of the body rows, then of the n % 4 tail rows padded to 4). Fp8AttentionOut:
// the kernel's e4m3 bytes and scales (with fp8_rows_zero on the rows it does not write) equal that
// quantisation placed in the Fp8RowsLayout, every byte of the buffers, over head counts 8 … 128
// (one to sixteen groups, a group inside a head, padded head groups), sliding, HCA and CSA key
// lists, row counts with tails 0–3 and calls that start at row > 0. Fp8LinearQuantised: on those
// rows it gives fp8_linear's output to the bit (bf16 and fp32 output, strided, tails 0–3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "io/model_config.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/rope.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill {
namespace {

namespace oc = ops::cuda;
using test_cuda::download;
using test_cuda::upload;

constexpr int kHeadDim = 512, kWindow = 128, kRopeDim = 64;

enum class Keys { kSliding, kHca, kCsa };

struct OutCase {
    int n_heads;
    int groups;  // wo_a groups (o_groups)
    Keys keys;
    int64_t n_q;   // queries of the attention call
    int64_t row0;  // its first row in the batch
    int64_t rows;  // rows of the batch (≥ row0 + n_q)
    float sink_scale = 1.0f;
};

std::string case_name(const ::testing::TestParamInfo<OutCase>& info) {
    static const char* const kNames[] = {"sliding", "hca", "csa"};
    const OutCase& c = info.param;
    return std::to_string(c.n_heads) + "h_" + std::to_string(c.groups) + "g_" +
           kNames[static_cast<int>(c.keys)] + "_" + std::to_string(c.n_q) + "q_at" +
           std::to_string(c.row0) + "_of" + std::to_string(c.rows) +
           (c.sink_scale > 1 ? "_big_sinks" : "");
}

// One request's KV store and queries: window keys, compressed entries (HCA: ratio 128, all
// eligible; CSA: ratio 4, 37 chosen with −1 padding), random positions, raw queries (the kernel
// normalises and rotates them, as the model asks).
struct DeviceCase {
    cuda::DeviceBuffer q, window, entries, sinks, idx, pos, inv_freq;
    oc::AttnArgs args;

    explicit DeviceCase(const OutCase& c) {
        const int64_t n_tokens = c.keys == Keys::kSliding ? 700 : 2100;
        const int ratio = c.keys == Keys::kSliding ? 0 : c.keys == Keys::kHca ? 128 : 4;
        const int64_t n_entries = ratio ? n_tokens / ratio : 0, top_k = 37;
        std::mt19937_64 rng(70 + c.n_q);
        std::vector<int64_t> p(c.n_q);
        std::uniform_int_distribution<int64_t> any(0, n_tokens - 1);
        for (int64_t& v : p) v = any(rng);
        if (c.n_q > 1) p[0] = n_tokens - 1, p[1] = 0;
        const std::vector<float> hq =
            test_cuda::random_bf16(c.n_q * c.n_heads * kHeadDim, 71, 3.0f);
        const std::vector<float> hw = test_cuda::random_bf16(n_tokens * kHeadDim, 72);
        const std::vector<float> he =
            test_cuda::random_bf16(std::max<int64_t>(n_entries, 1) * kHeadDim, 73);
        std::vector<int32_t> hidx;
        if (c.keys == Keys::kCsa) {
            hidx.assign(c.n_q * top_k, -1);
            for (int64_t i = 0; i < c.n_q; ++i) {
                std::vector<int32_t> all(std::min((p[i] + 1) / ratio, n_entries));
                std::iota(all.begin(), all.end(), 0);
                std::shuffle(all.begin(), all.end(), rng);
                const int64_t k = std::min<int64_t>(static_cast<int64_t>(all.size()), top_k);
                std::copy(all.begin(), all.begin() + k, hidx.begin() + i * top_k);
            }
        }
        q = cuda::upload_bf16(hq.data(), hq.size());
        window = cuda::upload_bf16(hw.data(), hw.size());
        entries = cuda::upload_bf16(he.data(), he.size());
        sinks = upload(test_cuda::random_f32(c.n_heads, 74, c.sink_scale));
        idx = upload(hidx);
        pos = upload(p);
        inv_freq = upload(ops::RopeTable(RopeParams{}, kRopeDim).inv_freq());
        args.q = q.as<__nv_bfloat16>();
        args.pos = pos.as<int64_t>();
        args.n_q = c.n_q;
        args.n_heads = c.n_heads;
        args.head_dim = kHeadDim;
        args.window = window.as<__nv_bfloat16>();
        args.window_size = kWindow;
        args.entries = entries.as<__nv_bfloat16>();
        args.n_entries = n_entries;
        args.ratio = ratio;
        args.entry_idx = c.keys == Keys::kCsa ? idx.as<int32_t>() : nullptr;
        args.idx_stride = c.keys == Keys::kCsa ? top_k : 0;
        args.sinks = sinks.as<float>();
        args.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
        args.q_norm = true;
        args.q_norm_eps = 1e-6f;
        args.rope_dim = kRopeDim;
        args.inv_freq = inv_freq.as<float>();
    }
};

// What fp8_linear quantises for wo_a group gi of o bf16 [rows, Hd] (the body rows with
// quantize_act_fp8, then the tail rows padded to 4), placed in the group's Fp8RowsLayout block.
void quantise_groups(const __nv_bfloat16* o, int64_t rows, int64_t hd, int groups, uint8_t* q,
                     float* scale) {
    const int64_t group_in = hd / groups;
    const oc::Fp8RowsLayout lay{rows, group_in};
    const int64_t body = lay.body(), tail = rows - body;
    for (int gi = 0; gi < groups; ++gi) {
        uint8_t* gq = q + gi * lay.q_bytes();
        float* gs = scale + gi * lay.scale_count();
        if (body > 0) oc::quantize_act_fp8(o + gi * group_in, hd, body, group_in, gq, gs, nullptr);
        if (tail > 0)
            oc::quantize_act_fp8(o + body * hd + gi * group_in, hd, tail, group_in,
                                 gq + body * group_in, gs + lay.scale_at(body, 0), nullptr, 4);
    }
}

// The first mismatching byte of two buffers, or −1.
int64_t first_mismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        if (a[i] != b[i]) return static_cast<int64_t>(i);
    return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

class Fp8AttentionOut : public ::testing::TestWithParam<OutCase> {};

TEST_P(Fp8AttentionOut, EqualsQuantisedBf16Output) {
    CPFILL_SKIP_WITHOUT_GPU();
    const OutCase c = GetParam();
    ASSERT_LE(c.row0 + c.n_q, c.rows);
    const int64_t hd = int64_t{c.n_heads} * kHeadDim, group_in = hd / c.groups;
    const oc::Fp8RowsLayout lay{c.rows, group_in};
    const size_t q_bytes = c.groups * lay.q_bytes(), s_bytes = c.groups * lay.scale_count() * 4;
    DeviceCase dev(c);

    // Today's path: bf16 o (zeros outside the call's rows), quantised per group.
    cuda::DeviceBuffer o(c.rows * hd * 2), ref_q(q_bytes), ref_s(s_bytes);
    CPFILL_CUDA_CHECK(cudaMemset(o.as<void>(), 0, o.bytes()));
    oc::AttnArgs a = dev.args;
    a.out = o.as<__nv_bfloat16>() + c.row0 * hd;
    oc::attention_tc(a, nullptr);
    quantise_groups(o.as<__nv_bfloat16>(), c.rows, hd, c.groups, ref_q.as<uint8_t>(),
                    ref_s.as<float>());

    // The fp8 output: poisoned buffers, the kernel's rows, fp8_rows_zero on the others.
    cuda::DeviceBuffer got_q(q_bytes), got_s(s_bytes);
    CPFILL_CUDA_CHECK(cudaMemset(got_q.as<void>(), 0x7f, q_bytes));
    CPFILL_CUDA_CHECK(cudaMemset(got_s.as<void>(), 0xff, s_bytes));
    oc::AttnArgs f = dev.args;
    f.out_q = got_q.as<void>();
    f.out_scale = got_s.as<float>();
    f.out_groups = c.groups;
    f.out_rows = c.rows;
    f.out_row0 = c.row0;
    oc::fp8_rows_zero(f.out_q, f.out_scale, c.rows, group_in, c.groups, 0, c.row0, nullptr);
    oc::attention_tc(f, nullptr);
    oc::fp8_rows_zero(f.out_q, f.out_scale, c.rows, group_in, c.groups, c.row0 + c.n_q,
                      lay.padded(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());

    // The bf16 output is not all zero (the comparison means something) …
    const std::vector<float> ob = cuda::download_bf16(o, c.rows * hd);
    ASSERT_TRUE(std::any_of(ob.begin() + c.row0 * hd, ob.begin() + (c.row0 + c.n_q) * hd,
                            [](float v) { return v != 0.0f; }));
    // … and every byte of the e4m3 rows and of the scales is the reference's.
    const std::vector<uint8_t> wq = download<uint8_t>(ref_q, q_bytes),
                               gq = download<uint8_t>(got_q, q_bytes);
    const int64_t bad_q = first_mismatch(gq, wq);
    if (bad_q >= 0) {
        const int64_t gi = bad_q / lay.q_bytes(), r = bad_q % lay.q_bytes() / group_in;
        FAIL() << "e4m3 byte " << bad_q << " (group " << gi << ", row " << r << ", column "
               << bad_q % group_in << "): got " << int(gq[bad_q]) << ", want " << int(wq[bad_q]);
    }
    const std::vector<float> ws = download<float>(ref_s, s_bytes / 4),
                             gs = download<float>(got_s, s_bytes / 4);
    for (size_t i = 0; i < ws.size(); ++i) {
        uint32_t g, w;
        std::memcpy(&g, &gs[i], 4);
        std::memcpy(&w, &ws[i], 4);
        ASSERT_EQ(g, w) << "scale " << i << " (group " << i / lay.scale_count() << "): got "
                        << gs[i] << ", want " << ws[i];
    }
}

// Flash (64 heads, 8 groups) and Pro (128 heads, 16 groups) shapes, one group (64 and 16 heads),
// groups of 128 columns (4 per head), a padded head group (24 heads, 3 groups); batches with tails
// of 0–3 rows, calls that start at row 0 and after it, every key list, sinks that dominate.
INSTANTIATE_TEST_SUITE_P(Cases, Fp8AttentionOut,
                         ::testing::Values(OutCase{64, 8, Keys::kCsa, 37, 5, 43},
                                           OutCase{64, 8, Keys::kSliding, 8, 0, 8},
                                           OutCase{64, 1, Keys::kHca, 20, 0, 21},
                                           OutCase{16, 8, Keys::kSliding, 13, 3, 18},
                                           OutCase{16, 1, Keys::kCsa, 6, 1, 7, 60.0f},
                                           OutCase{24, 3, Keys::kHca, 9, 2, 11},
                                           OutCase{8, 32, Keys::kCsa, 5, 0, 5},
                                           OutCase{128, 16, Keys::kSliding, 7, 1, 9},
                                           OutCase{128, 16, Keys::kCsa, 1, 2, 3}),
                         case_name);

TEST(Fp8AttentionOutArgs, RejectsGroupsOffTheScaleBlocks) {
    oc::AttnArgs a;
    a.n_q = 1;
    a.n_heads = 1;
    a.out_q = reinterpret_cast<void*>(uintptr_t{256});
    a.out_scale = reinterpret_cast<float*>(uintptr_t{512});
    a.out_rows = 1;
    a.out_groups = 8;  // 64 columns per group
    EXPECT_THROW(oc::attention_tc(a, nullptr), Error);
    a.out_groups = 3;  // 512 / 3
    EXPECT_THROW(oc::attention_tc(a, nullptr), Error);
    a.out_groups = 1;
    a.out_row0 = 1;  // past the batch's rows
    EXPECT_THROW(oc::attention_tc(a, nullptr), Error);
}

TEST(Fp8RowsLayout, TailScalesFollowTheBody) {
    const oc::Fp8RowsLayout lay{10, 256};  // body 8, tail 2 padded to 4
    EXPECT_EQ(lay.body(), 8);
    EXPECT_EQ(lay.padded(), 12);
    EXPECT_EQ(lay.q_bytes(), 12 * 256);
    EXPECT_EQ(lay.scale_count(), 24);
    EXPECT_EQ(lay.scale_at(3, 1), 8 + 3);        // [2][8], token fastest
    EXPECT_EQ(lay.scale_at(9, 0), 16 + 1);       // then [2][4]
    EXPECT_EQ(lay.scale_at(11, 1), 16 + 4 + 3);  // the last pad row
}

// fp8_linear_quantised on the Fp8RowsLayout quantise_groups makes against fp8_linear on the bf16
// rows: the same bytes, bf16 and fp32 output with a row stride above the width, sentinels around.
class Fp8LinearQuantised : public ::testing::TestWithParam<int64_t> {};

TEST_P(Fp8LinearQuantised, EqualsFp8Linear) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int64_t n = GetParam(), in = 512, out = 256, ldy = out + 8;
    const oc::Fp8RowsLayout lay{n, in};
    std::vector<float> x = test_cuda::random_bf16(n * in, 81);
    for (int64_t t = 0; t < n; ++t)  // every token and 128 channels its own magnitude
        for (int64_t k = 0; k < in; ++k)
            x[t * in + k] *= std::ldexp(1.0f, int((t * 5 + k / 128) % 11) - 5);
    const cuda::DeviceBuffer dx = cuda::upload_bf16(x.data(), x.size());
    const std::vector<float> w = test_cuda::random_f32(out * in, 82, 0.05f);
    const cuda::DeviceBuffer dw = upload(w);
    for (oc::Fp8Blocks blocks : {oc::Fp8Blocks::Tile128, oc::Fp8Blocks::Row128}) {
        SCOPED_TRACE(blocks == oc::Fp8Blocks::Tile128 ? "Tile128 weight" : "Row128 weight");
        cuda::DeviceBuffer wq(out * in), ws(oc::fp8_weight_scales(out, in, blocks) * 4);
        oc::quantize_weight_fp8(dw.as<float>(), out, in, blocks, wq.as<void>(), ws.as<float>(),
                                nullptr, nullptr);
        cuda::DeviceBuffer q(n * in), s(n * in / 128 * 4), tq(4 * in), ts(4 * in / 128 * 4),
            ty(4 * out * 4);
        const oc::Fp8LinearScratch sc{
            q.as<void>(), s.as<float>(), tq.as<void>(), ts.as<float>(), ty.as<float>(), n * in, in,
            out};
        cuda::DeviceBuffer xq(lay.q_bytes()), xs(lay.scale_count() * 4);
        quantise_groups(dx.as<__nv_bfloat16>(), n, in, 1, xq.as<uint8_t>(), xs.as<float>());
        const std::vector<float> init(n * ldy, -7.0f);
        cuda::DeviceBuffer ref32 = upload(init), got32 = upload(init);
        cuda::DeviceBuffer refb(n * ldy * 2), gotb(n * ldy * 2);
        CPFILL_CUDA_CHECK(cudaMemset(refb.as<void>(), 0xab, refb.bytes()));
        CPFILL_CUDA_CHECK(cudaMemset(gotb.as<void>(), 0xab, gotb.bytes()));
        oc::GemmContext ctx;
        oc::fp8_linear(ctx, sc, dx.as<__nv_bfloat16>(), in, n, in, wq.as<void>(), ws.as<float>(),
                       blocks, out, nullptr, ref32.as<float>(), ldy, nullptr);
        oc::fp8_linear_quantised(ctx, sc, xq.as<void>(), xs.as<float>(), n, in, wq.as<void>(),
                                 ws.as<float>(), blocks, out, nullptr, got32.as<float>(), ldy,
                                 nullptr);
        oc::fp8_linear(ctx, sc, dx.as<__nv_bfloat16>(), in, n, in, wq.as<void>(), ws.as<float>(),
                       blocks, out, refb.as<__nv_bfloat16>(), nullptr, ldy, nullptr);
        oc::fp8_linear_quantised(ctx, sc, xq.as<void>(), xs.as<float>(), n, in, wq.as<void>(),
                                 ws.as<float>(), blocks, out, gotb.as<__nv_bfloat16>(), nullptr,
                                 ldy, nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        const auto r32 = download<uint32_t>(ref32, n * ldy),
                   g32 = download<uint32_t>(got32, n * ldy);
        const auto rb = download<uint16_t>(refb, n * ldy), gb = download<uint16_t>(gotb, n * ldy);
        bool any = false;
        for (int64_t i = 0; i < n * ldy; ++i) {
            ASSERT_EQ(g32[i], r32[i]) << "fp32 row " << i / ldy << " column " << i % ldy;
            ASSERT_EQ(gb[i], rb[i]) << "bf16 row " << i / ldy << " column " << i % ldy;
            any |= i % ldy < out && r32[i] != 0;
        }
        EXPECT_TRUE(any) << "the output is all zero";
        float sentinel;
        std::memcpy(&sentinel, &g32[out], 4);
        EXPECT_EQ(sentinel, -7.0f) << "a gap column was written";
    }
}

// Body only, tails of 1–3 rows, rows below 4 (tail only).
INSTANTIATE_TEST_SUITE_P(Rows, Fp8LinearQuantised, ::testing::Values(8, 9, 10, 11, 1, 3, 40));

}  // namespace
}  // namespace cpfill
