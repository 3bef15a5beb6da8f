// The GPU attention (attention_tc) against ops/attention.h at the edge positions: sliding (window
// only), HCA (all eligible entries) and CSA (chosen entries with −1 padding) key lists, 1 to 128
// heads (partial head groups), queries at the edges of the window and of the compressed windows,
// sinks that dominate. bf16 output: tolerance 1e-2 of the tensor's scale. The grid of shapes is in
// test_attention_tc_cuda.cpp; the kernel's rate: bench/kernel_bench.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda_test_util.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"

namespace cpfill {
namespace {

using namespace test_cuda;

constexpr int kHeadDim = 512, kWindow = 128;

struct AttnCase {
    int n_heads;
    int64_t n_tokens;  // KV store length
    int ratio;         // 0 sliding, 128 HCA, 4 CSA
    int64_t top_k;     // CSA: entries chosen per query
    float sink_scale;
    std::vector<int64_t> pos;
};

// A KV store, queries and (CSA) chosen entries for case c.
struct AttnData {
    std::vector<float> q, window, entries, sinks;
    std::vector<int32_t> idx;  // [n_q, top_k]
    int64_t n_entries = 0;
};

AttnData make_data(const AttnCase& c, uint64_t seed) {
    AttnData d;
    const int64_t n_q = static_cast<int64_t>(c.pos.size());
    d.q = random_bf16(n_q * c.n_heads * kHeadDim, seed, 3.0f);
    d.window = random_bf16(c.n_tokens * kHeadDim, seed + 1);
    d.n_entries = c.ratio ? c.n_tokens / c.ratio : 0;
    d.entries = random_bf16(std::max<int64_t>(d.n_entries, 1) * kHeadDim, seed + 2);
    d.sinks = random_f32(c.n_heads, seed + 3, c.sink_scale);
    if (c.top_k > 0) {
        std::mt19937_64 rng(seed + 4);
        d.idx.assign(n_q * c.top_k, -1);
        for (int64_t i = 0; i < n_q; ++i) {
            const int64_t elig = std::min((c.pos[i] + 1) / c.ratio, d.n_entries);
            std::vector<int32_t> all(elig);
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            const int64_t k = std::min(elig, c.top_k);
            std::copy(all.begin(), all.begin() + k, d.idx.begin() + i * c.top_k);
        }
    }
    return d;
}

std::vector<float> cpu_attention(const AttnCase& c, const AttnData& d) {
    const int64_t n_q = static_cast<int64_t>(c.pos.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    std::vector<float> out(n_q * c.n_heads * kHeadDim), scratch;
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t p = c.pos[i], j0 = std::max<int64_t>(0, p - kWindow + 1);
        ops::AttnKeys keys;
        keys.window = d.window.data() + j0 * kHeadDim;
        keys.n_window = p - j0 + 1;
        if (c.ratio) {
            keys.entries = d.entries.data();
            keys.n_entries = std::min((p + 1) / c.ratio, d.n_entries);
            if (c.top_k > 0) {
                keys.entry_idx = d.idx.data() + i * c.top_k;
                keys.n_entries = std::min(keys.n_entries, c.top_k);
            }
        }
        scratch.resize(c.n_heads * (keys.n_window + keys.n_entries) + kHeadDim * keys.n_entries);
        ops::attend_one(d.q.data() + i * c.n_heads * kHeadDim, c.n_heads, kHeadDim, keys,
                        d.sinks.data(), scale, out.data() + i * c.n_heads * kHeadDim,
                        scratch.data());
    }
    return out;
}

// Device copies of a case's data and the arguments that point at them.
struct DeviceAttn {
    cuda::DeviceBuffer q, window, entries, sinks, idx, pos, out;
    ops::cuda::AttnArgs args;

    DeviceAttn(const AttnCase& c, const AttnData& d) {
        const int64_t n_q = static_cast<int64_t>(c.pos.size());
        q = cuda::upload_bf16(d.q.data(), d.q.size());
        window = cuda::upload_bf16(d.window.data(), d.window.size());
        entries = cuda::upload_bf16(d.entries.data(), d.entries.size());
        sinks = upload(d.sinks);
        idx = upload(d.idx);
        pos = upload(c.pos);
        out = cuda::DeviceBuffer(n_q * c.n_heads * kHeadDim * 2);
        args.q = q.as<__nv_bfloat16>();
        args.pos = pos.as<int64_t>();
        args.n_q = n_q;
        args.n_heads = c.n_heads;
        args.head_dim = kHeadDim;
        args.window = window.as<__nv_bfloat16>();
        args.window_size = kWindow;
        args.entries = entries.as<__nv_bfloat16>();
        args.n_entries = d.n_entries;
        args.ratio = c.ratio;
        args.entry_idx = c.top_k > 0 ? idx.as<int32_t>() : nullptr;
        args.idx_stride = c.top_k;
        args.sinks = sinks.as<float>();
        args.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
        args.out = out.as<__nv_bfloat16>();
    }
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const AttnCase c = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "heads " << c.n_heads << ", tokens " << c.n_tokens << ", ratio " << c.ratio
                 << ", top_k " << c.top_k << ", seeds 60-64");
    AttnData d = make_data(c, 60);
    std::vector<float> ref = cpu_attention(c, d);
    DeviceAttn dev(c, d);
    ops::cuda::attention_tc(dev.args, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff diffs = print_diff("out", diff(cuda::download_bf16(dev.out, ref.size()), ref));
    EXPECT_LE(diffs.rel, 1e-2) << diffs.str();
}

std::vector<int64_t> positions(std::initializer_list<int64_t> p) { return p; }

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAttention,
    ::testing::Values(
        // sliding: the first keys, the window edge
        AttnCase{5, 200, 0, 0, 1.0f, positions({0, 1, 2, 63, 64, 126, 127, 128, 129, 199})},
        // HCA: before, at and after the first complete 128-token window
        AttnCase{16, 300, 128, 0, 1.0f, positions({0, 126, 127, 128, 255, 256, 299})},
        // CSA: fewer eligible entries than top_k (−1 padding), then sparse
        AttnCase{64, 600, 4, 64, 1.0f, positions({0, 3, 4, 7, 100, 255, 256, 257, 599})},
        // one head; sinks far above and below the logits
        AttnCase{1, 130, 4, 7, 60.0f, positions({0, 5, 64, 129})},
        AttnCase{3, 130, 128, 0, 60.0f, positions({127, 128, 129})},
        // V4-Pro head count (8 groups), V4-Flash-like top-k on a longer store
        AttnCase{128, 2100, 4, 512, 1.0f, positions({2099, 2050, 1000, 17})},
        AttnCase{24, 1500, 128, 0, 1.0f, positions({1499, 1407, 1408, 640})}));

}  // namespace
}  // namespace cpfill
