// mHC on the GPU against ops/mhc.h over awkward shapes (1 row, widths not multiples of 32, Pro's
// 7168, hc 1–4). post and comb are fp32 on both sides (tolerance 1e-4 absolute: O(1) values after
// sigmoid / Sinkhorn, only the summation order of 4·d_model-long dot products differs); the
// collapse is bf16 (1e-2 of the tensor's scale); mhc_post updates the fp32 residual (1e-5).
#include <gtest/gtest.h>

#include <cmath>

#include "core/parallel.h"
#include "cuda_test_util.h"
#include "ops/cuda/mhc.h"
#include "ops/mhc.h"

namespace cpfill {
namespace {

using namespace test_cuda;

struct MhcShape {
    int64_t rows, d_model;
    int hc;
};

class CudaMhc : public ::testing::TestWithParam<MhcShape> {};

struct MhcWeights {
    std::vector<float> fn, base, scale;
};

MhcWeights make_weights(int n_mix, int hc, int64_t d_model, uint64_t seed) {
    const int64_t width = hc * d_model;
    MhcWeights w;
    w.fn = random_f32(n_mix * width, seed, 1.0f / std::sqrt(static_cast<float>(width)));
    w.base = random_f32(n_mix, seed + 1, 0.5f);
    w.scale = {0.7f, 1.3f, 2.0f};
    return w;
}

TEST_P(CudaMhc, PreMatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto [rows, d_model, hc] = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "rows " << rows << ", d_model " << d_model << ", hc " << hc << ", seeds 10-12");
    const int n_mix = (2 + hc) * hc;
    const int64_t width = hc * d_model;
    MhcWeights w = make_weights(n_mix, hc, d_model, 10);
    auto h = random_f32(rows * width, 12, 1.5f);

    ops::MhcParams p{w.fn.data(), w.base.data(), w.scale.data(), hc, d_model, 20, 1e-6f, 1e-6f};
    std::vector<float> post(rows * hc), comb(rows * hc * hc), x(rows * d_model);
    std::vector<float> mix(rows * n_mix), normed(rows * width);
    ThreadPool pool(4);
    ops::mhc_pre(p, h.data(), rows, post.data(), comb.data(), x.data(), mix.data(), normed.data(),
                 pool);

    auto dfn = upload(w.fn), dbase = upload(w.base), dscale = upload(w.scale), dh = upload(h);
    cuda::DeviceBuffer dpost(post.size() * 4), dcomb(comb.size() * 4), dx(x.size() * 2);
    ops::cuda::MhcDeviceParams dp{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), hc, d_model, 20, 1e-6f, 1e-6f};
    ops::cuda::GemmContext gemm;
    cuda::DeviceBuffer dmix(rows * n_mix * 4);
    CPFILL_CUDA_CHECK(cudaMemset(dpost.as<void>(), 0xff, dpost.bytes()));  // NaN if not written
    CPFILL_CUDA_CHECK(cudaMemset(dcomb.as<void>(), 0xff, dcomb.bytes()));
    ops::cuda::mhc_pre(dp, dh.as<float>(), rows, dpost.as<float>(), dcomb.as<float>(),
                       dx.as<__nv_bfloat16>(), gemm, dmix.as<float>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff gpo = print_diff("post (gemm)", diff(cuda::download_f32(dpost, post.size()), post));
    Diff gco = print_diff("comb (gemm)", diff(cuda::download_f32(dcomb, comb.size()), comb));
    Diff gxx = print_diff("x (gemm)", diff(cuda::download_bf16(dx, x.size()), x));
    EXPECT_LE(gpo.max_abs, 1e-4) << "post (gemm): " << gpo.str();
    EXPECT_LE(gco.max_abs, 1e-4) << "comb (gemm): " << gco.str();
    EXPECT_LE(gxx.rel, 1e-2) << "x (gemm): " << gxx.str();
}

TEST_P(CudaMhc, PostMatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto [rows, d_model, hc] = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "rows " << rows << ", d_model " << d_model << ", hc " << hc << ", seeds 20-23");
    auto post = random_f32(rows * hc, 20);
    auto comb = random_f32(rows * hc * hc, 21, 0.5f);
    auto o = random_bf16(rows * d_model, 22);
    auto h = random_f32(rows * hc * d_model, 23, 2.0f);
    auto dpost = upload(post), dcomb = upload(comb), dh = upload(h);
    auto dout = cuda::upload_bf16(o.data(), o.size());
    ThreadPool pool(4);
    ops::mhc_post(post.data(), comb.data(), o.data(), hc, d_model, rows, h.data(), pool);
    ops::cuda::mhc_post(dpost.as<float>(), dcomb.as<float>(), dout.as<__nv_bfloat16>(), hc, d_model,
                        rows, dh.as<float>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff d = print_diff("h", diff(cuda::download_f32(dh, h.size()), h));
    EXPECT_LE(d.rel, 1e-5) << d.str();
}

TEST_P(CudaMhc, HeadMatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto [rows, d_model, hc] = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "rows " << rows << ", d_model " << d_model << ", hc " << hc << ", seeds 30-32");
    const int64_t width = hc * d_model;
    MhcWeights w = make_weights(hc, hc, d_model, 30);
    w.scale = {0.9f};
    auto h = random_f32(rows * width, 32, 1.5f);
    std::vector<float> z(rows * d_model), normed(rows * width);
    ThreadPool pool(4);
    ops::mhc_head(w.fn.data(), w.base.data(), w.scale.data(), hc, d_model, 1e-6f, 1e-6f, h.data(),
                  rows, z.data(), normed.data(), pool);
    auto dfn = upload(w.fn), dbase = upload(w.base), dscale = upload(w.scale), dh = upload(h);
    cuda::DeviceBuffer dz(z.size() * 2);
    ops::cuda::mhc_head(dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), hc, d_model, 1e-6f,
                        1e-6f, dh.as<float>(), rows, dz.as<__nv_bfloat16>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff d = print_diff("z", diff(cuda::download_bf16(dz, z.size()), z));
    EXPECT_LE(d.rel, 1e-2) << d.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMhc,
                         ::testing::Values(MhcShape{1, 1, 4}, MhcShape{1, 7, 4}, MhcShape{3, 33, 4},
                                           MhcShape{5, 4096, 4}, MhcShape{9, 7168, 4},
                                           MhcShape{37, 300, 2}, MhcShape{130, 512, 3},
                                           MhcShape{6, 129, 1}, MhcShape{1001, 256, 4}));

}  // namespace
}  // namespace cpfill
