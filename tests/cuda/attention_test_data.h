// The attention tests' cases and data (test_attention_cuda.cpp, test_attention_tc_cuda.cpp): a KV
// store, queries at given positions and (CSA) chosen entries; the CPU reference (ops/attention.h)
// over them; their device copies and the kernel arguments that point at them.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"

namespace cpfill::test_cuda::attention {

constexpr int kHeadDim = 512, kWindow = 128;

struct AttnCase {
    int n_heads;
    int64_t n_tokens;  // KV store length
    int ratio;         // 0 sliding
    int64_t top_k;     // CSA: entries chosen per query; 0 = all eligible
    float sink_scale;
    std::vector<int64_t> pos;
};

// A KV store, queries and (CSA) chosen entries for a case.
struct AttnData {
    std::vector<float> q, window, entries, sinks;
    std::vector<int32_t> idx;  // [n_q, top_k]
    int64_t n_entries = 0;
};

inline AttnData make_data(const AttnCase& c, uint64_t seed) {
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

inline std::vector<float> cpu_attention(const AttnCase& c, const AttnData& d) {
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

// Device copies of a case's data and the arguments that point at them. The output starts as
// 0xFFFF (bf16 NaN) so rows a kernel leaves unwritten fail the comparison.
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
        poison_out();
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

    void poison_out() { CPFILL_CUDA_CHECK(cudaMemset(out.as<void>(), 0xff, out.bytes())); }
};

}  // namespace cpfill::test_cuda::attention
