// kernel_bench: the rates of single CUDA kernels at V4-Flash shapes (sparse attention on a CSA
// layer, the indexer's scores + top-k, the routed experts' GEMMs grouped vs one per expert, mHC
// pre/post and a site boundary separate vs fused). Numbers only, never pass/fail: the kernels'
// correctness is tests/cuda's job. These were "[ timing ]" lines printed by GPU tests that asserted
// nothing.
//   build/bench/kernel_bench [--kernel attention|indexer|experts|mhc|all] [--repeat N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/norm.h"
#include "runtime/cuda/buffer.h"
#include "runtime/cuda/time_ms.h"
#include "runtime/device.h"

namespace cpfill {
namespace {

// Normal(0, scale) values (rounded to bf16 where uploaded as bf16).
std::vector<float> random_values(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    cuda::DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T));
    if (!v.empty())
        CPFILL_CUDA_CHECK(
            cudaMemcpy(b.as<void>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

cuda::DeviceBuffer zeros(size_t bytes) {
    cuda::DeviceBuffer b(bytes);
    CPFILL_CUDA_CHECK(cudaMemset(b.as<void>(), 0, bytes));
    return b;
}

using cuda::time_ms;  // runtime/cuda/time_ms.h

// 1024 queries at positions 4096…5119 of a CSA layer: 64 heads, 128 window keys + 512 chosen
// compressed entries each.
void bench_attention(int reps) {
    const int n_heads = 64, head_dim = 512, ratio = 4, top_k = 512;
    const int64_t n_tokens = 5120, n_entries = n_tokens / ratio;
    std::vector<int64_t> pos;
    for (int64_t p = 4096; p < n_tokens; ++p) pos.push_back(p);
    const int64_t n_q = static_cast<int64_t>(pos.size());
    std::vector<int32_t> idx(n_q * top_k);
    std::mt19937_64 rng(74);
    for (int64_t i = 0; i < n_q; ++i) {  // top_k distinct eligible entries per query
        std::vector<int32_t> all((pos[i] + 1) / ratio);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        std::copy(all.begin(), all.begin() + top_k, idx.begin() + i * top_k);
    }
    const auto q = random_values(n_q * n_heads * head_dim, 70, 3.0f);
    const auto window = random_values(n_tokens * head_dim, 71);
    const auto entries = random_values(n_entries * head_dim, 72);
    const auto sinks = random_values(n_heads, 73);
    auto dq = cuda::upload_bf16(q.data(), q.size());
    auto dwindow = cuda::upload_bf16(window.data(), window.size());
    auto dentries = cuda::upload_bf16(entries.data(), entries.size());
    auto dsinks = upload(sinks), didx = upload(idx), dpos = upload(pos);
    cuda::DeviceBuffer dout(n_q * n_heads * head_dim * 2);
    ops::cuda::AttnArgs a;
    a.q = dq.as<__nv_bfloat16>();
    a.pos = dpos.as<int64_t>();
    a.n_q = n_q;
    a.n_heads = n_heads;
    a.head_dim = head_dim;
    a.window = dwindow.as<__nv_bfloat16>();
    a.window_size = 128;
    a.entries = dentries.as<__nv_bfloat16>();
    a.n_entries = n_entries;
    a.ratio = ratio;
    a.entry_idx = didx.as<int32_t>();
    a.idx_stride = top_k;
    a.sinks = dsinks.as<float>();
    a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    a.out = dout.as<__nv_bfloat16>();
    const double flops = ops::cuda::attention_flops(a, pos.data(), idx.data());
    const double ms = time_ms([&] { ops::cuda::attention_tc(a, nullptr); }, reps);
    std::printf("attention_tc %lld queries x %d heads x 640 keys: %.3f ms, %.1f TFLOP/s\n",
                static_cast<long long>(n_q), n_heads, ms, flops / (ms * 1e-3) / 1e12);
}

// 1024 queries at positions 15360…16383 over 4096 compressed entries, 64 heads × 128, top-512.
void bench_indexer(int reps) {
    const int n_heads = 64, dim = 128;
    const int64_t n_q = 1024, n_entries = 4096, top_k = 512;
    std::vector<int64_t> pos(n_q);
    std::iota(pos.begin(), pos.end(), int64_t{15360});
    const auto q = random_values(n_q * n_heads * dim, 80);
    const auto keys = random_values(n_entries * dim, 81);
    const auto w = random_values(n_q * n_heads, 82, 1.0f / std::sqrt(float(n_heads)));
    auto dq = cuda::upload_bf16(q.data(), q.size());
    auto dkeys = cuda::upload_bf16(keys.data(), keys.size());
    auto dw = upload(w), dpos = upload(pos);
    cuda::DeviceBuffer didx(n_q * top_k * 4), dscores(n_q * n_entries * 4);
    ops::cuda::IndexerArgs a;
    a.q = dq.as<__nv_bfloat16>();
    a.weight = dw.as<float>();
    a.pos = dpos.as<int64_t>();
    a.n_q = n_q;
    a.n_heads = n_heads;
    a.dim = dim;
    a.keys = dkeys.as<__nv_bfloat16>();
    a.n_entries = n_entries;
    a.ratio = 4;
    a.top_k = top_k;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    a.idx = didx.as<int32_t>();
    const double ms = time_ms(
        [&] { ops::cuda::indexer_topk(a, dscores.as<float>(), n_q * n_entries, nullptr); }, reps);
    const double flops = 2.0 * n_q * n_entries * n_heads * dim;
    std::printf(
        "indexer %lld queries x %lld entries, top-%lld: %.3f ms, %.1f TFLOP/s (scores + top-k)\n",
        static_cast<long long>(n_q), static_cast<long long>(n_entries),
        static_cast<long long>(top_k), ms, flops / (ms * 1e-3) / 1e12);
}

// V4-Flash at 64k tokens, CP = 2: 256 experts × ~1,536 rows; gate_up 4096 → 2 · 1024, down
// 1024 → 4096 (each rank's half of the expert width). Zeros: GEMM rates do not depend on values.
void bench_experts(int reps) {
    const int E = 256;
    std::vector<int32_t> counts(E);
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> jitter(-300, 300);
    for (auto& c : counts) c = 1536 + jitter(rng);
    const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    auto dcounts = upload(counts);
    ops::cuda::GroupedGemm g(E);
    ops::cuda::GemmContext ctx;
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{4096, 2048}, {1024, 4096}}) {
        auto dx = zeros(rows * in * 2), dw = zeros(E * out * in * 2), dy = zeros(rows * out * 2);
        const auto* x = dx.as<__nv_bfloat16>();
        const auto* w = dw.as<__nv_bfloat16>();
        auto* y = dy.as<__nv_bfloat16>();
        const double grouped = time_ms(
            [&] { g.experts(dcounts.as<int32_t>(), counts.data(), E, x, in, w, out, y, nullptr); },
            reps);
        const double looped = time_ms(
            [&] {
                int64_t first = 0;
                for (int e = 0; e < E; ++e) {
                    ops::cuda::linear_bf16(ctx, x + first * in, counts[e], in, w + e * out * in,
                                           out, y + first * out, nullptr, false, nullptr);
                    first += counts[e];
                }
            },
            reps);
        const double tflop = 2.0 * rows * in * out * 1e-12;
        std::printf(
            "experts %d x %lld rows, %lld -> %lld: grouped %.3f ms (%.0f TFLOP/s), one GEMM per "
            "expert %.3f ms (%.0f TFLOP/s)\n",
            E, static_cast<long long>(rows), static_cast<long long>(in),
            static_cast<long long>(out), grouped, tflop / grouped * 1e3, looped,
            tflop / looped * 1e3);
    }
}

// mHC pre (with the fp32 GEMM, as the runner does) and post on 8192 rows × 4 streams × 4096, the
// site boundary apart and fused, and fused with a bf16 residual. Zeros for h: the rate does not
// depend on the values (rsqrt(0 + eps) is finite).
void bench_mhc(int reps) {
    const int hc = 4;
    const int64_t rows = 8192, d_model = 4096, width = hc * d_model;
    const int n_mix = (2 + hc) * hc;
    auto dfn = upload(random_values(n_mix * width, 40, 1.0f / std::sqrt(float(width))));
    auto dbase = upload(random_values(n_mix, 41, 0.5f));
    auto dscale = upload(std::vector<float>{0.7f, 1.3f, 2.0f});
    auto dh = zeros(rows * width * 4), dout = zeros(rows * d_model * 2);
    cuda::DeviceBuffer dpost(rows * hc * 4), dcomb(rows * hc * hc * 4), dx(rows * d_model * 2);
    cuda::DeviceBuffer dmix(rows * n_mix * 4);
    ops::cuda::MhcDeviceParams p{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), hc, d_model, 20, 1e-6f, 1e-6f};
    ops::cuda::GemmContext gemm;
    const double pre_gemm_ms = time_ms(
        [&] {
            ops::cuda::mhc_pre(p, dh.as<float>(), rows, dpost.as<float>(), dcomb.as<float>(),
                               dx.as<__nv_bfloat16>(), gemm, dmix.as<float>(), nullptr);
        },
        reps);
    const double post_ms = time_ms(
        [&] {
            ops::cuda::mhc_post(dpost.as<float>(), dcomb.as<float>(), dout.as<__nv_bfloat16>(), hc,
                                d_model, rows, dh.as<float>(), nullptr);
        },
        reps);
    const double h_gb = rows * width * 4 / 1e9;
    std::printf("mhc_pre %lld x %d x %lld: %.3f ms (%.0f GB/s of h, read twice)\n",
                static_cast<long long>(rows), hc, static_cast<long long>(d_model), pre_gemm_ms,
                2 * h_gb / (pre_gemm_ms * 1e-3));
    std::printf("mhc_post %lld x %d x %lld: %.3f ms (%.0f GB/s of h, read + write)\n",
                static_cast<long long>(rows), hc, static_cast<long long>(d_model), post_ms,
                2 * h_gb / (post_ms * 1e-3));

    // A site boundary as the runner ran it (mhc_post → mhc_pre → rmsnorm) and fused. The GB/s
    // count 3 passes of h for both (the fused floor: read, write, read for the collapse).
    auto dw = upload(std::vector<float>(d_model, 1.0f));
    cuda::DeviceBuffer dpost2(rows * hc * 4), dcomb2(rows * hc * hc * 4), dy(rows * d_model * 2);
    cuda::DeviceBuffer dscratch(ops::cuda::mhc_post_pre_scratch_bytes(hc, d_model, rows));
    const double separate_ms = time_ms(
        [&] {
            ops::cuda::mhc_post(dpost.as<float>(), dcomb.as<float>(), dout.as<__nv_bfloat16>(), hc,
                                d_model, rows, dh.as<float>(), nullptr);
            ops::cuda::mhc_pre(p, dh.as<float>(), rows, dpost2.as<float>(), dcomb2.as<float>(),
                               dx.as<__nv_bfloat16>(), gemm, dmix.as<float>(), nullptr);
            ops::cuda::rmsnorm(dx.as<__nv_bfloat16>(), rows, d_model, dw.as<float>(), 1e-6f,
                               dy.as<__nv_bfloat16>(), nullptr);
        },
        reps);
    // The fused boundary on an fp32 or a bf16 residual h (mhc_post_pre's two overloads).
    const auto fused = [&](auto* h) {
        return time_ms(
            [&] {
                ops::cuda::mhc_post_pre(dpost.as<float>(), dcomb.as<float>(),
                                        dout.as<__nv_bfloat16>(), p, dw.as<float>(), 1e-6f, rows, h,
                                        dpost2.as<float>(), dcomb2.as<float>(),
                                        dy.as<__nv_bfloat16>(), dscratch.as<float>(), nullptr);
            },
            reps);
    };
    const double fused_ms = fused(dh.as<float>());
    std::printf(
        "mhc boundary (post + pre + rmsnorm) %lld x %d x %lld: separate %.3f ms (%.0f GB/s), "
        "fused %.3f ms (%.0f GB/s of h, 3 passes), %.2fx\n",
        static_cast<long long>(rows), hc, static_cast<long long>(d_model), separate_ms,
        3 * h_gb / (separate_ms * 1e-3), fused_ms, 3 * h_gb / (fused_ms * 1e-3),
        separate_ms / fused_ms);
    // The same fused boundary with a bf16 residual (--residual bf16): half the bytes of h.
    auto dh16 = zeros(rows * width * 2);
    const double fused16_ms = fused(dh16.as<__nv_bfloat16>());
    std::printf(
        "mhc boundary, bf16 residual: fused %.3f ms (%.0f GB/s of h, 3 passes), %.2fx the fp32 "
        "boundary's speed\n",
        fused16_ms, 3 * h_gb / 2 / (fused16_ms * 1e-3), fused_ms / fused16_ms);
}

}  // namespace
}  // namespace cpfill

int main(int argc, char** argv) {
    using namespace cpfill;
    CLI::App app{"kernel_bench: single CUDA kernels at V4-Flash shapes"};
    std::string kernel = "all";
    int reps = 5;
    app.add_option("--kernel", kernel, "attention, indexer, experts, mhc or all")
        ->check(CLI::IsMember({"attention", "indexer", "experts", "mhc", "all"}));
    app.add_option("--repeat", reps, "timed calls per kernel (after one warm-up)")
        ->check(CLI::Range(1, 1000));
    CLI11_PARSE(app, argc, argv);
    try {
        std::string why;
        CPFILL_CHECK(cuda_device_count(&why) > 0, "kernel_bench needs a GPU: {}", why);
        if (kernel == "attention" || kernel == "all") bench_attention(reps);
        if (kernel == "indexer" || kernel == "all") bench_indexer(reps);
        if (kernel == "experts" || kernel == "all") bench_experts(reps);
        if (kernel == "mhc" || kernel == "all") bench_mhc(reps);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
