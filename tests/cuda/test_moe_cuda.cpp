// MoE router and SwiGLU on the GPU against ops/moe.h. Router: the same fp32 logits on both sides,
// so the chosen experts must agree in order, except where two candidates' CPU keys are within
// 1e-5 (expf / log1pf differ by an ulp between the CUDA and host libraries); integer logits give
// exact ties that must be broken alike (lower expert first). Weights: 1e-5 relative. SwiGLU: bf16
// output, 1e-2 of the tensor's scale, with clamps active, disabled, and a per-row scale.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "ops/cuda/moe.h"
#include "ops/moe.h"

namespace cpfill {
namespace {

using namespace test_cuda;

struct RouteCase {
    int64_t n;
    int n_experts, top_k;
    bool bias, hash, integer;
};

class CudaRoute : public ::testing::TestWithParam<RouteCase> {};

float cpu_key(float logit, float bias) {
    const float sp = logit > 20.0f ? logit : std::log1p(std::exp(logit));
    return std::sqrt(sp) + bias;
}

TEST_P(CudaRoute, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const RouteCase c = GetParam();
    SCOPED_TRACE(testing::Message() << "n " << c.n << ", experts " << c.n_experts << ", top_k "
                                    << c.top_k << ", seeds 100-102");
    const int E = c.n_experts, K = c.top_k;
    std::vector<float> logits = random_f32(c.n * E, 100, 2.0f), bias;
    if (c.integer)
        for (float& x : logits) x = std::round(x);
    if (c.bias) bias = random_f32(E, 101, 0.3f);
    std::vector<int64_t> hash;
    if (c.hash) {
        std::mt19937_64 rng(102);
        hash.resize(c.n * K);
        for (int64_t t = 0; t < c.n; ++t)
            for (int i = 0; i < K; ++i)
                hash[t * K + i] = static_cast<int64_t>((t * 7 + i * 13 + rng() % 3) % E);
    }
    std::vector<int32_t> idx(c.n * K);
    std::vector<float> weight(c.n * K);
    ops::route(logits.data(), c.n, E, K, c.bias ? bias.data() : nullptr,
               c.hash ? hash.data() : nullptr, 1.5f, idx.data(), weight.data());

    auto dlogits = upload(logits), dbias = upload(bias), dhash = upload(hash);
    cuda::DeviceBuffer didx(idx.size() * 4), dweight(weight.size() * 4);
    ops::cuda::route(dlogits.as<float>(), c.n, E, K, c.bias ? dbias.as<float>() : nullptr,
                     c.hash ? dhash.as<int64_t>() : nullptr, 1.5f, didx.as<int32_t>(),
                     dweight.as<float>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    auto gidx = download<int32_t>(didx, idx.size());
    auto gweight = download<float>(dweight, weight.size());

    int64_t swaps = 0;
    std::vector<float> ref_w, got_w;
    for (int64_t t = 0; t < c.n; ++t) {
        bool same = true;
        for (int i = 0; i < K; ++i) {
            const int32_t a = gidx[t * K + i], b = idx[t * K + i];
            if (a == b) continue;
            same = false;
            ASSERT_FALSE(c.integer || c.hash)
                << "token " << t << " slot " << i << ": " << a << " vs " << b;
            ASSERT_GE(a, 0);
            ASSERT_LT(a, E);
            const float* lt = logits.data() + t * E;
            const float ka = cpu_key(lt[a], c.bias ? bias[a] : 0.0f);
            const float kb = cpu_key(lt[b], c.bias ? bias[b] : 0.0f);
            EXPECT_LE(std::abs(ka - kb), 1e-5f * std::max(1.0f, std::abs(kb)))
                << "token " << t << " slot " << i << ": expert " << a << " vs " << b;
        }
        if (!same) {
            ++swaps;
            continue;
        }
        for (int i = 0; i < K; ++i) {
            ref_w.push_back(weight[t * K + i]);
            got_w.push_back(gweight[t * K + i]);
        }
    }
    if (swaps)
        std::printf("[ info ] %lld tokens with near-tie swaps\n", static_cast<long long>(swaps));
    Diff d = print_diff("weights", diff(got_w, ref_w));
    EXPECT_LE(d.rel, 1e-5) << "weights: " << d.str();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaRoute,
                         ::testing::Values(RouteCase{1, 8, 2, false, false, false},
                                           RouteCase{37, 256, 6, true, false, false},
                                           RouteCase{1000, 384, 6, true, false, false},
                                           RouteCase{5, 1024, 32, true, false, false},
                                           RouteCase{33, 33, 32, false, false, false},
                                           RouteCase{300, 256, 6, false, false, true},
                                           RouteCase{100, 256, 6, false, true, false},
                                           RouteCase{3, 7, 1, true, false, false}));

struct SwigluCase {
    int64_t n, moe_dim;
    float limit;
    bool row_scale;
};

class CudaSwiglu : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(CudaSwiglu, MatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const SwigluCase c = GetParam();
    SCOPED_TRACE(testing::Message() << "n " << c.n << ", moe_dim " << c.moe_dim << ", limit "
                                    << c.limit << ", seeds 110-111");
    auto gu = random_bf16(c.n * 2 * c.moe_dim, 110, 8.0f);  // beyond ±10 often: clamps engage
    auto scale = random_f32(c.n, 111);
    std::vector<float> ref(c.n * c.moe_dim);
    ops::swiglu(gu.data(), c.n, c.moe_dim, c.limit, ref.data());
    if (c.row_scale)
        for (int64_t t = 0; t < c.n; ++t)
            for (int64_t i = 0; i < c.moe_dim; ++i) ref[t * c.moe_dim + i] *= scale[t];
    auto dgu = cuda::upload_bf16(gu.data(), gu.size());
    auto dscale = upload(scale);
    cuda::DeviceBuffer dact(ref.size() * 2);
    ops::cuda::swiglu(dgu.as<__nv_bfloat16>(), c.n, c.moe_dim, c.limit,
                      c.row_scale ? dscale.as<float>() : nullptr, dact.as<__nv_bfloat16>(),
                      nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff d = print_diff("act", diff(cuda::download_bf16(dact, ref.size()), ref));
    EXPECT_LE(d.rel, 1e-2) << d.str();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaSwiglu,
                         ::testing::Values(SwigluCase{1, 1, 10.0f, false},
                                           SwigluCase{3, 100, 10.0f, true},
                                           SwigluCase{37, 2048, 10.0f, false},
                                           SwigluCase{1000, 3072, 10.0f, true},
                                           SwigluCase{17, 129, 0.0f, false}));

}  // namespace
}  // namespace cpfill
