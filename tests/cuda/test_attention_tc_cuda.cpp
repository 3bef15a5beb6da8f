// The two tensor-core attention kernels, attention_tc (mma.sync) and attention_wg (wgmma; where
// the GPU runs it), each against ops/attention.h, the CPU reference test_attention_cuda.cpp
// uses (tolerance 1e-2 of the tensor's scale, bf16 output), over a grid of awkward shapes: 8, 16,
// 24, 64 and 128 heads; sliding, HCA (few and many entries) and CSA (top-k with −1 padding, top-k
// below a tile) key lists; 1, 37 and 300 queries at positions near 0, at the window's and the
// compressed windows' edges, in a consecutive run and at random. (The CUDA-core kernel it was also
// compared with is gone, stop 18.) The cases' data and the CPU reference: attention_test_data.h.
// CudaAttentionTcNormRope: the per-head RMSNorm and RoPE folded into the kernel (AttnArgs q_norm,
// rope_dim) on raw queries, against the CPU ops the model uses and against the separate GPU
// passes they replace. DISABLED_ rates of both: scripts/attention-tc-check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "attention_test_data.h"
#include "cuda_test_util.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rope.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace cpfill {
namespace {

using namespace test_cuda;
using namespace test_cuda::attention;

// Key lists of the grid. kHcaDense: ratio 4, all eligible entries (up to 525, 11 tiles of keys).
enum class Keys { kSliding, kHca, kHcaDense, kCsa, kCsaSmall };

struct TcCase {
    int n_heads;
    Keys keys;
    int64_t n_q;
    float sink_scale = 1.0f;
};

// Positions: the last token, the first ones, the edges of the 128-key window and of the ratio-4
// and ratio-128 windows, then a consecutive run and random ones.
// The kernels under test: attention_tc everywhere, attention_wg where the GPU runs it (persistent
// blocks, and a block per item).
struct Kernel {
    const char* name;
    void (*run)(const ops::cuda::AttnArgs&, cudaStream_t);
};

void wg_persistent(const ops::cuda::AttnArgs& a, cudaStream_t s) {
    ops::cuda::attention_wg(a, s, true);
}
void wg_per_item(const ops::cuda::AttnArgs& a, cudaStream_t s) {
    ops::cuda::attention_wg(a, s, false);
}

std::vector<Kernel> kernels() {
    std::vector<Kernel> k{{"attention_tc", ops::cuda::attention_tc}};
    if (ops::cuda::attention_wg_supported()) {
        k.push_back({"attention_wg", wg_persistent});
        k.push_back({"attention_wg (a block per item)", wg_per_item});
    }
    return k;
}

std::vector<int64_t> make_positions(int64_t n_q, int64_t n_tokens, uint64_t seed) {
    std::vector<int64_t> pos;
    for (int64_t p :
         {n_tokens - 1, int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{126}, int64_t{127},
          int64_t{128}, int64_t{129}, int64_t{255}, int64_t{256}, int64_t{2047}, int64_t{2048}})
        if (p < n_tokens && static_cast<int64_t>(pos.size()) < n_q) pos.push_back(p);
    std::mt19937_64 rng(seed);
    const int64_t run = (n_q - static_cast<int64_t>(pos.size())) / 2;
    const int64_t start = std::uniform_int_distribution<int64_t>(0, n_tokens - run)(rng);
    for (int64_t i = 0; i < run; ++i) pos.push_back(start + i);
    std::uniform_int_distribution<int64_t> any(0, n_tokens - 1);
    while (static_cast<int64_t>(pos.size()) < n_q) pos.push_back(any(rng));
    return pos;
}

AttnCase make_case(const TcCase& tc) {
    AttnCase c{tc.n_heads, 2100, 4, 0, tc.sink_scale, {}};
    switch (tc.keys) {
        case Keys::kSliding:
            c.n_tokens = 700, c.ratio = 0;
            break;
        case Keys::kHca:
            c.ratio = 128;
            break;
        case Keys::kHcaDense:
            break;
        case Keys::kCsa:
            c.top_k = 512;
            break;
        case Keys::kCsaSmall:
            c.top_k = 37;
            break;
    }
    c.pos = make_positions(tc.n_q, c.n_tokens, 80 + tc.n_q);
    return c;
}

std::string case_name(const ::testing::TestParamInfo<TcCase>& info) {
    static const char* const kNames[] = {"sliding", "hca", "hca_dense", "csa", "csa_small"};
    const TcCase& c = info.param;
    return std::to_string(c.n_heads) + "h_" + kNames[static_cast<int>(c.keys)] + "_" +
           std::to_string(c.n_q) + "q" + (c.sink_scale > 1 ? "_big_sinks" : "");
}

class CudaAttentionTc : public ::testing::TestWithParam<TcCase> {};

// Every kernel of kernels() on dev's arguments (output poisoned first) against ref, 1e-2 of its
// scale.
void expect_every_kernel_matches(DeviceAttn& dev, const std::vector<float>& ref) {
    for (const Kernel& k : kernels()) {
        SCOPED_TRACE(k.name);
        dev.poison_out();
        k.run(dev.args, nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        const Diff diffs = print_diff(k.name, diff(cuda::download_bf16(dev.out, ref.size()), ref));
        EXPECT_LE(diffs.rel, 1e-2) << diffs.str();
    }
}

TEST_P(CudaAttentionTc, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const AttnCase c = make_case(GetParam());
    SCOPED_TRACE(testing::Message()
                 << "heads " << c.n_heads << ", tokens " << c.n_tokens << ", ratio " << c.ratio
                 << ", top_k " << c.top_k << ", queries " << c.pos.size() << ", seeds 90-94");
    const AttnData d = make_data(c, 90);
    const std::vector<float> ref = cpu_attention(c, d);
    DeviceAttn dev(c, d);
    expect_every_kernel_matches(dev, ref);
}

std::vector<TcCase> grid() {
    std::vector<TcCase> cases;
    for (int n_heads : {8, 16, 24, 64, 128})
        for (Keys keys : {Keys::kSliding, Keys::kHca, Keys::kHcaDense, Keys::kCsa, Keys::kCsaSmall})
            for (int64_t n_q : {1, 37, 300}) cases.push_back({n_heads, keys, n_q});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, CudaAttentionTc, ::testing::ValuesIn(grid()), case_name);

// Head counts that leave most of a 16-head group padded or split 64 + 16; sinks far above and
// below the logits (the output shrinks towards 0 and the sink dominates the denominator).
INSTANTIATE_TEST_SUITE_P(
    Edges, CudaAttentionTc,
    ::testing::Values(TcCase{1, Keys::kCsa, 5, 60.0f}, TcCase{3, Keys::kHca, 13, 60.0f},
                      TcCase{5, Keys::kSliding, 37}, TcCase{33, Keys::kCsaSmall, 37},
                      TcCase{80, Keys::kCsa, 37}, TcCase{128, Keys::kHcaDense, 64, 60.0f}),
    case_name);

// The window keys as chunked prefill keeps them (model/cuda/gpu_attention.h): a buffer that starts
// at position window0, here the earliest key the queries read (the last 300 positions of the
// store, consecutive). The device holds only those rows, so a kernel that read rows by position
// would read past the buffer's start and differ from the CPU.
TEST(CudaAttentionTcWindowBuffer, RowsFromWindow0MatchCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    for (Keys keys : {Keys::kSliding, Keys::kCsa, Keys::kHcaDense}) {
        AttnCase c = make_case(TcCase{64, keys, 300});
        c.pos.clear();
        for (int64_t p = c.n_tokens - 300; p < c.n_tokens; ++p) c.pos.push_back(p);
        SCOPED_TRACE(testing::Message() << "tokens " << c.n_tokens << ", ratio " << c.ratio
                                        << ", top_k " << c.top_k << ", seeds 95-99");
        const AttnData d = make_data(c, 95);
        const std::vector<float> ref = cpu_attention(c, d);
        const int64_t w0 = c.n_tokens - 300 - (kWindow - 1);
        DeviceAttn dev(c, d);
        dev.window =
            cuda::upload_bf16(d.window.data() + w0 * kHeadDim, (c.n_tokens - w0) * kHeadDim);
        dev.args.window = dev.window.as<__nv_bfloat16>();
        dev.args.window0 = w0;
        ops::cuda::attention_tc(dev.args, nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        const Diff diffs = print_diff("out", diff(cuda::download_bf16(dev.out, ref.size()), ref));
        EXPECT_LE(diffs.rel, 1e-2) << diffs.str();
    }
}

TEST(CudaAttentionTcArgs, RejectsANegativeWindow0) {
    ops::cuda::AttnArgs a;
    a.n_q = 1;
    a.n_heads = 8;
    a.window0 = -1;
    EXPECT_THROW(ops::cuda::attention_tc(a, nullptr), Error);
}

// Folded norm and RoPE as the model uses them (model/attention.cpp): eps 1e-6, 64 RoPE channels.
constexpr int kRopeDim = 64;
constexpr float kNormEps = 1e-6f;

void fold_norm_rope(ops::cuda::AttnArgs& a, const cuda::DeviceBuffer& inv_freq) {
    a.q_norm = true;
    a.q_norm_eps = kNormEps;
    a.rope_dim = kRopeDim;
    a.inv_freq = inv_freq.as<float>();
}

class CudaAttentionTcNormRope : public ::testing::TestWithParam<TcCase> {};

// Raw queries: the reference normalises and rotates them on the host and de-rotates its output.
TEST_P(CudaAttentionTcNormRope, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const AttnCase c = make_case(GetParam());
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << ", ratio " << c.ratio << ", top_k "
                                    << c.top_k << ", queries " << c.pos.size() << ", seeds 90-94");
    const int64_t n_q = static_cast<int64_t>(c.pos.size()), ld = int64_t{c.n_heads} * kHeadDim;
    const ops::RopeTable rope(RopeParams{}, kRopeDim);
    const AttnData d = make_data(c, 90);
    AttnData normed = d;
    ops::rmsnorm(normed.q.data(), n_q * c.n_heads, kHeadDim, nullptr, kNormEps, normed.q.data());
    ops::apply_rope(rope, normed.q.data(), n_q, ld, c.n_heads, kHeadDim, c.pos.data(), false);
    std::vector<float> ref = cpu_attention(c, normed);
    ops::apply_rope(rope, ref.data(), n_q, ld, c.n_heads, kHeadDim, c.pos.data(), true);

    DeviceAttn dev(c, d);
    const cuda::DeviceBuffer inv_freq = upload(rope.inv_freq());
    fold_norm_rope(dev.args, inv_freq);
    expect_every_kernel_matches(dev, ref);
}

// The same raw queries through the passes the options replace: rmsnorm, apply_rope, attention_tc
// with the options off, inverse apply_rope, against every kernel with the options on. The passes
// round q and out twice where the kernels round once (and sum the squares in another order), so
// rows differ by a bf16 ulp here and there: allowed 3 ulps at the output's scale.
TEST_P(CudaAttentionTcNormRope, MatchesSeparateKernels) {
    CPFILL_SKIP_WITHOUT_GPU();
    const AttnCase c = make_case(GetParam());
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << ", ratio " << c.ratio << ", top_k "
                                    << c.top_k << ", queries " << c.pos.size() << ", seeds 90-94");
    const int64_t n_q = static_cast<int64_t>(c.pos.size()), ld = int64_t{c.n_heads} * kHeadDim;
    const ops::RopeTable rope(RopeParams{}, kRopeDim);
    const cuda::DeviceBuffer inv_freq = upload(rope.inv_freq());
    const AttnData d = make_data(c, 90);

    DeviceAttn separate(c, d);
    __nv_bfloat16* q = separate.q.as<__nv_bfloat16>();
    ops::cuda::rmsnorm(q, n_q * c.n_heads, kHeadDim, nullptr, kNormEps, q, nullptr);
    ops::cuda::apply_rope(q, n_q, ld, c.n_heads, kHeadDim, kRopeDim, inv_freq.as<float>(),
                          separate.args.pos, false, nullptr);
    ops::cuda::attention_tc(separate.args, nullptr);
    ops::cuda::apply_rope(separate.args.out, n_q, ld, c.n_heads, kHeadDim, kRopeDim,
                          inv_freq.as<float>(), separate.args.pos, true, nullptr);

    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> ref = cuda::download_bf16(separate.out, n_q * ld);
    double scale = 0;
    for (float v : ref) scale = std::max(scale, double(std::abs(v)));
    ASSERT_TRUE(std::isfinite(scale) && scale > 0) << "separate passes: scale " << scale;
    const double ulp = std::ldexp(1.0, std::ilogb(scale) - 7);  // bf16: 8 significant bits

    DeviceAttn fused(c, d);
    fold_norm_rope(fused.args, inv_freq);
    for (const Kernel& k : kernels()) {
        SCOPED_TRACE(k.name);
        fused.poison_out();
        k.run(fused.args, nullptr);
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
        const Diff diffs =
            print_diff(k.name, diff(cuda::download_bf16(fused.out, ref.size()), ref));
        EXPECT_LE(diffs.max_abs, 3 * ulp) << diffs.str();
    }
}

// Every head-group size, padded groups (5, 24 and 80 heads), one query, every key list; 300
// queries (more items than multiprocessors), so that each persistent block norms and rotates the
// Q of several items, copied while its previous item finished.
INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionTcNormRope,
                         ::testing::Values(TcCase{5, Keys::kCsa, 37}, TcCase{16, Keys::kSliding, 1},
                                           TcCase{24, Keys::kHca, 37},
                                           TcCase{64, Keys::kCsaSmall, 37},
                                           TcCase{80, Keys::kHcaDense, 64},
                                           TcCase{128, Keys::kCsa, 37}, TcCase{24, Keys::kHca, 300},
                                           TcCase{80, Keys::kCsa, 300}),
                         case_name);

TEST(CudaAttentionTcArgs, RejectsOtherHeadDims) {
    ops::cuda::AttnArgs a;
    a.n_q = 1;
    a.n_heads = 8;
    a.head_dim = 256;
    EXPECT_THROW(ops::cuda::attention_tc(a, nullptr), Error);
}

TEST(CudaAttentionTcArgs, RejectsRopeWithoutFrequencies) {
    ops::cuda::AttnArgs a;
    a.n_q = 1;
    a.n_heads = 8;
    a.rope_dim = 64;
    EXPECT_THROW(ops::cuda::attention_tc(a, nullptr), Error);
}

// CPFILL_ATTENTION's names; any other is refused naming the value and the choices.
TEST(CudaAttentionTcArgs, AttentionKernelNames) {
    EXPECT_EQ(ops::cuda::parse_attention_kernel(nullptr), ops::cuda::AttnKernel::Auto);
    EXPECT_EQ(ops::cuda::parse_attention_kernel("auto"), ops::cuda::AttnKernel::Auto);
    EXPECT_EQ(ops::cuda::parse_attention_kernel("tc"), ops::cuda::AttnKernel::Tc);
    EXPECT_EQ(ops::cuda::parse_attention_kernel("wg"), ops::cuda::AttnKernel::Wg);
    try {
        ops::cuda::parse_attention_kernel("flash");
        ADD_FAILURE() << "CPFILL_ATTENTION=flash accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("CPFILL_ATTENTION=flash: expected auto (the default), "
                                             "tc or wg"),
                  std::string::npos)
            << e.what();
    }
}

// attention_wg makes the same checks, before it asks for the GPU (so these run without one).
TEST(CudaAttentionTcArgs, WgmmaKernelRejectsTheSame) {
    ops::cuda::AttnArgs a;
    a.n_q = 1;
    a.n_heads = 8;
    a.head_dim = 256;
    EXPECT_THROW(ops::cuda::attention_wg(a, nullptr), Error);
    a.head_dim = 512;
    a.rope_dim = 64;
    EXPECT_THROW(ops::cuda::attention_wg(a, nullptr), Error);
    // Its RoPE slice is staged in 16 KB: at most 64 channels, said before anything runs.
    a.rope_dim = 128;
    const float inv_freq = 1.0f;
    a.inv_freq = &inv_freq;
    try {
        ops::cuda::attention_wg(a, nullptr);
        ADD_FAILURE() << "rope_dim 128 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rope_dim 128 (at most 64)"), std::string::npos)
            << e.what();
    }
}

// Rates (information, not pass/fail; scripts/attention-tc-check.sh runs them): 16384 consecutive
// queries, 64 heads, 128 window keys plus 512 chosen entries (CSA) or 256 entries (HCA) each.
// Queries repeat a 64-query random block (the rate does not depend on the values). attention_wg
// also with q's norm and RoPE folded, as the model runs it.
void print_rates(const char* name, int64_t first_pos, int ratio, int64_t n_entries, int64_t top_k) {
    constexpr int64_t kQueries = 16384, kBlock = 64;
    constexpr int kHeads = 64;
    AttnCase c{kHeads, first_pos + kQueries, ratio, top_k, 1.0f, {}};
    for (int64_t p = first_pos; p < first_pos + kQueries; ++p) c.pos.push_back(p);
    AttnData d;
    d.window = random_bf16(c.n_tokens * kHeadDim, 100);
    d.n_entries = n_entries;
    d.entries = random_bf16(n_entries * kHeadDim, 101);
    d.sinks = random_f32(kHeads, 102);
    if (top_k > 0) {
        std::mt19937_64 rng(103);
        d.idx.resize(kQueries * top_k);
        std::vector<int32_t> all;
        for (int64_t i = 0; i < kQueries; ++i) {  // top_k distinct eligible entries
            all.resize(std::min((c.pos[i] + 1) / ratio, n_entries));
            std::iota(all.begin(), all.end(), 0);
            for (int64_t k = 0; k < top_k; ++k) {
                std::uniform_int_distribution<size_t> pick(k, all.size() - 1);
                std::swap(all[k], all[pick(rng)]);
                d.idx[i * top_k + k] = all[k];
            }
        }
    }
    d.q.assign(kHeads * kHeadDim, 0.0f);  // a placeholder: the queries are filled below
    DeviceAttn dev(c, d);
    dev.q = cuda::DeviceBuffer(kQueries * kHeads * kHeadDim * 2);
    const cuda::DeviceBuffer block = cuda::upload_bf16(
        random_bf16(kBlock * kHeads * kHeadDim, 104).data(), kBlock * kHeads * kHeadDim);
    for (int64_t i = 0; i < kQueries; i += kBlock)
        CPFILL_CUDA_CHECK(cudaMemcpy(dev.q.as<__nv_bfloat16>() + i * kHeads * kHeadDim,
                                     block.as<void>(), block.bytes(), cudaMemcpyDeviceToDevice));
    dev.args.q = dev.q.as<__nv_bfloat16>();

    const double flops =
        ops::cuda::attention_flops(dev.args, c.pos.data(), top_k > 0 ? d.idx.data() : nullptr);
    if (ops::cuda::attention_wg_supported()) {  // as the model calls it: q's norm and RoPE folded
        const ops::RopeTable rope(RopeParams{}, kRopeDim);
        const cuda::DeviceBuffer inv_freq = upload(rope.inv_freq());
        ops::cuda::AttnArgs folded = dev.args;
        fold_norm_rope(folded, inv_freq);
        const double ms = time_ms([&] { ops::cuda::attention_wg(folded, nullptr); }, 10);
        std::printf(
            "[ rate ] %s %lld queries x %d heads: attention_wg with q's norm and RoPE "
            "folded %.2f ms %.1f TFLOP/s\n",
            name, static_cast<long long>(kQueries), kHeads, ms, flops / ms * 1e-9);
    }
    for (const Kernel& k : kernels()) {
        const double ms = time_ms([&] { k.run(dev.args, nullptr); }, 10);
        std::printf(
            "[ rate ] %s %lld queries x %d heads, %.0f keys/query: %s %.2f ms %.1f TFLOP/s\n", name,
            static_cast<long long>(kQueries), kHeads, flops / (4.0 * kHeads * kHeadDim * kQueries),
            k.name, ms, flops / ms * 1e-9);
    }
}

TEST(CudaAttentionTcRate, DISABLED_CsaLike) {
    CPFILL_SKIP_WITHOUT_GPU();
    print_rates("CSA", 2048, 4, (2048 + 16384) / 4, 512);
}

TEST(CudaAttentionTcRate, DISABLED_HcaLike) {
    CPFILL_SKIP_WITHOUT_GPU();
    print_rates("HCA", 32767, 128, 256, 0);
}

}  // namespace
}  // namespace cpfill
