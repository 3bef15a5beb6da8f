// mHC on the GPU against ops/mhc.h over awkward shapes (1 row, widths not multiples of 32, Pro's
// 7168, hc 1–4). post and comb are fp32 on both sides (tolerance 1e-4 absolute: O(1) values after
// sigmoid / Sinkhorn, only the summation order of 4·d_model-long dot products differs); the
// collapse is bf16 (1e-2 of the tensor's scale); mhc_post updates the fp32 residual (1e-5).
// mhc_post_pre (post, next pre and RMSNorm fused) against the same three GPU ops run one after
// the other and against the CPU ops, with and without the norm, with post / comb updated in
// place, and on unaligned pointers (the scalar kernels); shapes for each of its paths. A bf16
// residual (ops/cuda/mhc.h): each update is the fp32 path's on the same values, rounded (bit for
// bit), and what follows from it matches the CPU ops with the same rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "core/parallel.h"
#include "cuda_test_util.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rows.h"
#include "ops/mhc.h"
#include "ops/norm.h"

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

// bf16 bits of v (round to nearest even), and back.
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
    return r;
}
std::vector<float> widen(const std::vector<uint16_t>& v) {
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(v[i]);
    return r;
}

// A bf16 residual: the update is the fp32 kernel's on the same values, rounded once.
TEST_P(CudaMhc, PostBf16IsTheFp32UpdateRounded) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto [rows, d_model, hc] = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "rows " << rows << ", d_model " << d_model << ", hc " << hc << ", seeds 20-23");
    auto post = random_f32(rows * hc, 20);
    auto comb = random_f32(rows * hc * hc, 21, 0.5f);
    auto o = random_bf16(rows * d_model, 22);
    const std::vector<uint16_t> hb = to_bf16(random_f32(rows * hc * d_model, 23, 2.0f));
    auto dpost = upload(post), dcomb = upload(comb), dh32 = upload(widen(hb)), dh16 = upload(hb);
    auto dout = cuda::upload_bf16(o.data(), o.size());
    ops::cuda::mhc_post(dpost.as<float>(), dcomb.as<float>(), dout.as<__nv_bfloat16>(), hc, d_model,
                        rows, dh32.as<float>(), nullptr);
    ops::cuda::mhc_post(dpost.as<float>(), dcomb.as<float>(), dout.as<__nv_bfloat16>(), hc, d_model,
                        rows, dh16.as<__nv_bfloat16>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> want = to_bf16(download<float>(dh32, hb.size()));
    const std::vector<uint16_t> got = download<uint16_t>(dh16, hb.size());
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << "of " << want.size() << " values";
}

// mhc_pre and mhc_head on a bf16 h (the dot products in the kernel) against the CPU on its values.
TEST_P(CudaMhc, PreAndHeadOnBf16MatchCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    const auto [rows, d_model, hc] = GetParam();
    SCOPED_TRACE(testing::Message()
                 << "rows " << rows << ", d_model " << d_model << ", hc " << hc << ", seeds 90-93");
    const int n_mix = (2 + hc) * hc;
    const int64_t width = hc * d_model;
    MhcWeights w = make_weights(n_mix, hc, d_model, 90);
    MhcWeights wh = make_weights(hc, hc, d_model, 92);
    wh.scale = {0.9f};
    const std::vector<uint16_t> hb = to_bf16(random_f32(rows * width, 93, 1.5f));
    std::vector<float> h = widen(hb);

    ops::MhcParams p{w.fn.data(), w.base.data(), w.scale.data(), hc, d_model, 20, 1e-6f, 1e-6f};
    std::vector<float> post(rows * hc), comb(rows * hc * hc), x(rows * d_model), z(rows * d_model);
    std::vector<float> mix(rows * n_mix), normed(rows * width);
    ThreadPool pool(4);
    ops::mhc_pre(p, h.data(), rows, post.data(), comb.data(), x.data(), mix.data(), normed.data(),
                 pool);
    ops::mhc_head(wh.fn.data(), wh.base.data(), wh.scale.data(), hc, d_model, 1e-6f, 1e-6f,
                  h.data(), rows, z.data(), normed.data(), pool);

    auto dfn = upload(w.fn), dbase = upload(w.base), dscale = upload(w.scale), dh = upload(hb);
    auto dhfn = upload(wh.fn), dhbase = upload(wh.base), dhscale = upload(wh.scale);
    cuda::DeviceBuffer dpost(post.size() * 4), dcomb(comb.size() * 4), dx(x.size() * 2),
        dz(z.size() * 2);
    CPFILL_CUDA_CHECK(cudaMemset(dpost.as<void>(), 0xff, dpost.bytes()));  // NaN if not written
    CPFILL_CUDA_CHECK(cudaMemset(dcomb.as<void>(), 0xff, dcomb.bytes()));
    ops::cuda::MhcDeviceParams dp{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), hc, d_model, 20, 1e-6f, 1e-6f};
    ops::cuda::mhc_pre(dp, dh.as<__nv_bfloat16>(), rows, dpost.as<float>(), dcomb.as<float>(),
                       dx.as<__nv_bfloat16>(), nullptr);
    ops::cuda::mhc_head(dhfn.as<float>(), dhbase.as<float>(), dhscale.as<float>(), hc, d_model,
                        1e-6f, 1e-6f, dh.as<__nv_bfloat16>(), rows, dz.as<__nv_bfloat16>(),
                        nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    Diff po = print_diff("post (bf16 h)", diff(cuda::download_f32(dpost, post.size()), post));
    Diff co = print_diff("comb (bf16 h)", diff(cuda::download_f32(dcomb, comb.size()), comb));
    Diff xx = print_diff("x (bf16 h)", diff(cuda::download_bf16(dx, x.size()), x));
    Diff zz = print_diff("z (bf16 h)", diff(cuda::download_bf16(dz, z.size()), z));
    EXPECT_LE(po.max_abs, 1e-4) << "post: " << po.str();
    EXPECT_LE(co.max_abs, 1e-4) << "comb: " << co.str();
    EXPECT_LE(xx.rel, 1e-2) << "x: " << xx.str();
    EXPECT_LE(zz.rel, 1e-2) << "z: " << zz.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMhc,
                         ::testing::Values(MhcShape{1, 1, 4}, MhcShape{1, 7, 4}, MhcShape{3, 33, 4},
                                           MhcShape{5, 4096, 4}, MhcShape{9, 7168, 4},
                                           MhcShape{37, 300, 2}, MhcShape{130, 512, 3},
                                           MhcShape{6, 129, 1}, MhcShape{1001, 256, 4}));

// ---- mhc_post_pre ----

// One site boundary's inputs: post / comb / o of the site that ends, the residual h, the next
// site's weights and the RMSNorm weight.
struct Boundary {
    int64_t rows, d_model;
    int hc;
    std::vector<float> post, comb, o, h, norm_w;
    MhcWeights next;
};

Boundary make_boundary(const MhcShape& shape, uint64_t seed) {
    const auto [rows, d_model, hc] = shape;
    Boundary b{rows, d_model, hc, {}, {}, {}, {}, {}, {}};
    b.post = random_f32(rows * hc, seed, 0.5f);
    b.comb = random_f32(rows * hc * hc, seed + 1, 0.5f);
    b.o = random_bf16(rows * d_model, seed + 2);
    b.h = random_f32(rows * hc * d_model, seed + 3, 1.5f);
    b.norm_w = random_f32(d_model, seed + 4, 0.3f);
    for (float& w : b.norm_w) w += 1.0f;
    b.next = make_weights((2 + hc) * hc, hc, d_model, seed + 5);
    return b;
}

// h after the update, the next site's post / comb, and y (fp32, or bf16 widened).
struct BoundaryOut {
    std::vector<float> h, post, comb, y;
};

// ops::mhc_pre on the updated residual h → x rounded to bf16 → ops::rmsnorm (norm) or x itself.
BoundaryOut cpu_site(const Boundary& b, std::vector<float> h, bool norm) {
    const int64_t rows = b.rows, D = b.d_model, n_mix = (2 + b.hc) * b.hc;
    BoundaryOut r{std::move(h), std::vector<float>(rows * b.hc),
                  std::vector<float>(rows * b.hc * b.hc), std::vector<float>(rows * D)};
    ThreadPool pool(4);
    ops::MhcParams p{
        b.next.fn.data(), b.next.base.data(), b.next.scale.data(), b.hc, D, 20, 1e-6f, 1e-6f};
    std::vector<float> x(rows * D), mix(rows * n_mix), normed(rows * b.hc * D);
    ops::mhc_pre(p, r.h.data(), rows, r.post.data(), r.comb.data(), x.data(), mix.data(),
                 normed.data(), pool);
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
    if (norm)
        ops::rmsnorm(x.data(), rows, D, b.norm_w.data(), 1e-6f, r.y.data());
    else
        r.y = x;
    return r;
}

// ops::mhc_post (→ h rounded to bf16 with round_h: a bf16 residual), then cpu_site.
BoundaryOut cpu_boundary(const Boundary& b, bool norm, bool round_h = false) {
    std::vector<float> h = b.h;
    ThreadPool pool(4);
    ops::mhc_post(b.post.data(), b.comb.data(), b.o.data(), b.hc, b.d_model, b.rows, h.data(),
                  pool);
    if (round_h)
        for (float& v : h) v = bf16_to_f32(f32_to_bf16(v));
    return cpu_site(b, std::move(h), norm);
}

// Device copy of v starting `offset` elements into its buffer (offset 1: an unaligned tensor), with
// kGuard poisoned elements after it.
constexpr size_t kGuard = 64;

template <class T>
cuda::DeviceBuffer upload_at(const std::vector<T>& v, size_t offset) {
    cuda::DeviceBuffer b((offset + v.size() + kGuard) * sizeof(T));
    CPFILL_CUDA_CHECK(cudaMemset(b.as<void>(), 0xff, b.bytes()));
    if (!v.empty())
        CPFILL_CUDA_CHECK(
            cudaMemcpy(b.as<T>() + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

// The bytes of b outside [begin, end) are still the 0xff poison.
void expect_guard(const cuda::DeviceBuffer& b, size_t begin, size_t end, const char* what) {
    std::vector<uint8_t> bytes(b.bytes());
    CPFILL_CUDA_CHECK(cudaMemcpy(bytes.data(), b.as<void>(), bytes.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < bytes.size(); ++i) bad += (i < begin || i >= end) && bytes[i] != 0xff;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " bytes written outside the tensor";
}

struct FusedOptions {
    bool norm = true;     // norm_w given
    bool alias = false;   // post_out == post_in, comb_out == comb_in
    size_t offset = 0;    // elements h, o and y start into their buffers
    bool bf16_h = false;  // the residual in bf16 (b.h rounded to it on the way)
    // Which op: mhc_post_pre; mhc_pre_first (b.h: every stream a copy of stream 0, first_site_h;
    // streams 1 … hc − 1 are NaN on the device, so what comes back is finite only if stream 0
    // alone was read; h must come back byte for byte); mhc_post_pre_first (b.h: first_site_h;
    // streams 1 … hc − 1 NaN on the device, as with PreFirst; h comes back updated in every
    // stream).
    enum class Op { PostPre, PreFirst, PostPreFirst } op = Op::PostPre;
};
using FusedOp = FusedOptions::Op;

BoundaryOut gpu_fused(const Boundary& b, FusedOptions opt) {
    const int64_t rows = b.rows, D = b.d_model;
    const size_t off = opt.offset;
    auto dfn = upload(b.next.fn), dbase = upload(b.next.base), dscale = upload(b.next.scale);
    auto dpost_in = upload(b.post), dcomb_in = upload(b.comb), dw = upload(b.norm_w);
    std::vector<float> h_in = b.h;
    const bool first = opt.op == FusedOp::PreFirst;
    if (opt.op != FusedOp::PostPre)
        for (int64_t r = 0; r < rows; ++r)
            std::fill_n(h_in.begin() + (r * b.hc + 1) * D, (b.hc - 1) * D, std::nanf(""));
    auto dh = opt.bf16_h ? upload_at(to_bf16(h_in), off) : upload_at(h_in, off);
    std::vector<uint8_t> h_before;  // PreFirst: h as uploaded, to compare after the call
    if (first) {
        h_before.resize(dh.bytes());
        CPFILL_CUDA_CHECK(
            cudaMemcpy(h_before.data(), dh.as<void>(), h_before.size(), cudaMemcpyDeviceToHost));
    }
    auto dout = upload_at(to_bf16(b.o), off);
    auto dy = upload_at(std::vector<uint16_t>(rows * D), off);
    CPFILL_CUDA_CHECK(cudaMemset(dy.as<void>(), 0xff, dy.bytes()));  // NaN if not written
    cuda::DeviceBuffer dpost(rows * b.hc * 4), dcomb(rows * b.hc * b.hc * 4);
    CPFILL_CUDA_CHECK(cudaMemset(dpost.as<void>(), 0xff, dpost.bytes()));
    CPFILL_CUDA_CHECK(cudaMemset(dcomb.as<void>(), 0xff, dcomb.bytes()));
    const int64_t scratch_bytes = ops::cuda::mhc_post_pre_scratch_bytes(b.hc, D, rows);
    cuda::DeviceBuffer dscratch(scratch_bytes + kGuard);  // NaN where read before written
    CPFILL_CUDA_CHECK(cudaMemset(dscratch.as<void>(), 0xff, dscratch.bytes()));
    ops::cuda::MhcDeviceParams p{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), b.hc, D, 20, 1e-6f, 1e-6f};
    float* post_out = opt.alias ? dpost_in.as<float>() : dpost.as<float>();
    float* comb_out = opt.alias ? dcomb_in.as<float>() : dcomb.as<float>();
    const float* norm_w = opt.norm ? dw.as<float>() : nullptr;
    auto call = [&](auto* h) {  // h: the residual at its offset, fp32 or bf16
        __nv_bfloat16* const y = dy.as<__nv_bfloat16>() + off;
        if (opt.op == FusedOp::PreFirst)
            ops::cuda::mhc_pre_first(p, norm_w, 1e-6f, rows, h, post_out, comb_out, y,
                                     dscratch.as<float>(), nullptr);
        else if (opt.op == FusedOp::PostPreFirst)
            ops::cuda::mhc_post_pre_first(dpost_in.as<float>(), dcomb_in.as<float>(),
                                          dout.as<__nv_bfloat16>() + off, p, norm_w, 1e-6f, rows, h,
                                          post_out, comb_out, y, dscratch.as<float>(), nullptr);
        else
            ops::cuda::mhc_post_pre(dpost_in.as<float>(), dcomb_in.as<float>(),
                                    dout.as<__nv_bfloat16>() + off, p, norm_w, 1e-6f, rows, h,
                                    post_out, comb_out, y, dscratch.as<float>(), nullptr);
    };
    if (opt.bf16_h)
        call(dh.as<__nv_bfloat16>() + off);
    else
        call(dh.as<float>() + off);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    expect_guard(dscratch, 0, scratch_bytes, "scratch");
    expect_guard(dy, off * 2, (off + rows * D) * 2, "y");
    const size_t hb = opt.bf16_h ? 2 : 4;
    expect_guard(dh, off * hb, (off + b.h.size()) * hb, "h");
    BoundaryOut r;
    if (first) {
        std::vector<uint8_t> h_after(dh.bytes());
        CPFILL_CUDA_CHECK(
            cudaMemcpy(h_after.data(), dh.as<void>(), h_after.size(), cudaMemcpyDeviceToHost));
        EXPECT_TRUE(h_after == h_before) << "mhc_pre_first wrote to h";
        r.h = b.h;
    } else if (opt.bf16_h) {
        auto h = download<uint16_t>(dh, off + b.h.size());
        for (size_t i = off; i < h.size(); ++i) r.h.push_back(bf16_to_f32(h[i]));
    } else {
        auto h = download<float>(dh, off + b.h.size());
        r.h.assign(h.begin() + off, h.end());
    }
    auto yb = download<uint16_t>(dy, off + rows * D);
    for (size_t i = off; i < yb.size(); ++i) r.y.push_back(bf16_to_f32(yb[i]));
    r.post = download<float>(opt.alias ? dpost_in : dpost, rows * b.hc);
    r.comb = download<float>(opt.alias ? dcomb_in : dcomb, rows * b.hc * b.hc);
    return r;
}

// mhc_post → mhc_pre (cuBLASLt GEMM) → rmsnorm, the path mhc_post_pre replaces.
BoundaryOut gpu_separate(const Boundary& b, bool norm) {
    const int64_t rows = b.rows, D = b.d_model, n_mix = (2 + b.hc) * b.hc;
    auto dfn = upload(b.next.fn), dbase = upload(b.next.base), dscale = upload(b.next.scale);
    auto dpost_in = upload(b.post), dcomb_in = upload(b.comb), dw = upload(b.norm_w);
    auto dh = upload(b.h), dout = upload(to_bf16(b.o));
    cuda::DeviceBuffer dpost(rows * b.hc * 4), dcomb(rows * b.hc * b.hc * 4);
    cuda::DeviceBuffer dx(rows * D * 2), dy(rows * D * 2), dmix(rows * n_mix * 4);
    ops::cuda::MhcDeviceParams p{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), b.hc, D, 20, 1e-6f, 1e-6f};
    ops::cuda::GemmContext gemm;
    ops::cuda::mhc_post(dpost_in.as<float>(), dcomb_in.as<float>(), dout.as<__nv_bfloat16>(), b.hc,
                        D, rows, dh.as<float>(), nullptr);
    ops::cuda::mhc_pre(p, dh.as<float>(), rows, dpost.as<float>(), dcomb.as<float>(),
                       dx.as<__nv_bfloat16>(), gemm, dmix.as<float>(), nullptr);
    if (norm)
        ops::cuda::rmsnorm(dx.as<__nv_bfloat16>(), rows, D, dw.as<float>(), 1e-6f,
                           dy.as<__nv_bfloat16>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return {cuda::download_f32(dh, b.h.size()), cuda::download_f32(dpost, rows * b.hc),
            cuda::download_f32(dcomb, rows * b.hc * b.hc),
            cuda::download_bf16(norm ? dy : dx, rows * D)};
}

// h: 1e-5 of its scale (the update is mhc_post's arithmetic; the CPU sums in another order).
// post / comb: 1e-4 absolute (O(1) after sigmoid / Sinkhorn; the mixing products are fp32 summed in
// another order than the GEMM's or the CPU's). y: 1e-2 of its scale (bf16 output, 2^-9 relative,
// and a bf16 x whose rounding may flip by one ulp where x differs in its last fp32 bits).
void expect_close(const BoundaryOut& got, const BoundaryOut& want, const std::string& vs) {
    Diff dh = print_diff(("h vs " + vs).c_str(), diff(got.h, want.h));
    Diff dp = print_diff(("post vs " + vs).c_str(), diff(got.post, want.post));
    Diff dc = print_diff(("comb vs " + vs).c_str(), diff(got.comb, want.comb));
    Diff dy = print_diff(("y vs " + vs).c_str(), diff(got.y, want.y));
    EXPECT_LE(dh.rel, 1e-5) << "h vs " << vs << ": " << dh.str();
    EXPECT_LE(dp.max_abs, 1e-4) << "post vs " << vs << ": " << dp.str();
    EXPECT_LE(dc.max_abs, 1e-4) << "comb vs " << vs << ": " << dc.str();
    EXPECT_LE(dy.rel, 1e-2) << "y vs " << vs << ": " << dy.str();
}

// A bf16 residual against the CPU's: the CPU sums the update in another order before rounding, so
// the two fp32 sums differ by a few fp32 steps of the terms' size (h's scale), and where a sum
// lands next to a rounding boundary the bf16 values are one step apart; near zero (terms
// cancelling) the fp32 difference itself can be many bf16 steps of the tiny result. So each value
// is within one bf16 step of the CPU's or within 2^-20 of h's scale, and values apart are rare. One
// step of h moves the next site's mixing products by that step times a weight of fn, which the
// sigmoid and the Sinkhorn pass on to post and comb well above their 1e-4: so post, comb and y are
// checked against the CPU's site math run on the GPU's own h, where the usual tolerances hold.
void expect_bf16_residual_close(const Boundary& b, const BoundaryOut& got, bool norm) {
    const BoundaryOut want = cpu_boundary(b, norm, true);
    ASSERT_EQ(got.h.size(), want.h.size());
    double scale = 0;
    for (float v : want.h) scale = std::max(scale, double(std::abs(v)));
    const double sum_tol = std::ldexp(scale, -20);
    size_t apart = 0, worst = 0;
    double worst_excess = 0;  // the difference over what is allowed (> 1: too far)
    for (size_t i = 0; i < got.h.size(); ++i) {
        if (got.h[i] == want.h[i]) continue;
        ++apart;
        // One bf16 step at the larger magnitude: 2^(exponent − 7).
        const float m = std::max(std::abs(got.h[i]), std::abs(want.h[i]));
        const double step = std::ldexp(1.0, std::ilogb(m) - 7);
        const double excess = std::abs(double(got.h[i]) - want.h[i]) / std::max(step, sum_tol);
        if (!(excess <= worst_excess)) worst_excess = excess, worst = i;
    }
    EXPECT_LE(worst_excess, 1.0) << "h vs CPU with a bf16 h: " << got.h[worst] << " vs "
                                 << want.h[worst] << " at " << worst
                                 << ", more than one bf16 step and more than " << sum_tol
                                 << " (2^-20 of h's scale " << scale << ") apart";
    EXPECT_LE(apart, got.h.size() / 100 + 1)
        << "h vs CPU with a bf16 h: " << apart << " of " << got.h.size() << " values differ";
    std::printf("[ info ] bf16 h vs CPU: %zu of %zu values one step apart\n", apart, got.h.size());
    expect_close(got, cpu_site(b, got.h, norm), "CPU site math on the GPU's bf16 h");
}

class CudaMhcPostPre : public ::testing::TestWithParam<MhcShape> {};

std::string describe(const MhcShape& s, uint64_t seed) {
    std::ostringstream m;
    m << "rows " << s.rows << ", d_model " << s.d_model << ", hc " << s.hc << ", seeds " << seed
      << "-" << seed + 5;
    return m.str();
}

TEST_P(CudaMhcPostPre, MatchesSeparateOpsAndCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 40));
    const Boundary b = make_boundary(GetParam(), 40);
    const BoundaryOut got = gpu_fused(b, {});
    expect_close(got, gpu_separate(b, true), "separate GPU ops");
    expect_close(got, cpu_boundary(b, true), "CPU");
}

TEST_P(CudaMhcPostPre, WithoutNormYIsTheCollapse) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 50));
    const Boundary b = make_boundary(GetParam(), 50);
    const BoundaryOut got = gpu_fused(b, {.norm = false});
    expect_close(got, gpu_separate(b, false), "separate GPU ops");
    expect_close(got, cpu_boundary(b, false), "CPU");
}

TEST_P(CudaMhcPostPre, PostCombInPlaceMatchCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 60));
    const Boundary b = make_boundary(GetParam(), 60);
    expect_close(gpu_fused(b, {.alias = true}), cpu_boundary(b, true), "CPU");
}

TEST_P(CudaMhcPostPre, UnalignedPointersMatchCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 70));
    const Boundary b = make_boundary(GetParam(), 70);
    expect_close(gpu_fused(b, {.offset = 1}), cpu_boundary(b, true), "CPU");
}

// A bf16 residual at a site boundary: h is the fp32 path's update rounded, bit for bit (the same
// arithmetic on the same values), and post / comb / y follow the rounded h as the CPU ops do.
TEST_P(CudaMhcPostPre, Bf16ResidualIsTheFp32UpdateRoundedAndMatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 80));
    Boundary b = make_boundary(GetParam(), 80);
    for (float& v : b.h) v = bf16_to_f32(f32_to_bf16(v));  // what a bf16 h holds
    const BoundaryOut f = gpu_fused(b, {});
    const BoundaryOut g = gpu_fused(b, {.bf16_h = true});
    ASSERT_EQ(f.h.size(), g.h.size());
    size_t differ = 0;
    for (size_t i = 0; i < f.h.size(); ++i) differ += f32_to_bf16(f.h[i]) != f32_to_bf16(g.h[i]);
    EXPECT_EQ(differ, 0u) << "of " << f.h.size() << " values";
    expect_bf16_residual_close(b, g, true);
}

// The same through the scalar kernels (pointers one element off their alignment), without norm.
TEST_P(CudaMhcPostPre, Bf16ResidualUnalignedMatchesCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 85));
    Boundary b = make_boundary(GetParam(), 85);
    for (float& v : b.h) v = bf16_to_f32(f32_to_bf16(v));
    expect_bf16_residual_close(b, gpu_fused(b, {.norm = false, .offset = 1, .bf16_h = true}),
                               false);
}

// The shapes of CudaMhc, and some with enough rows (≥ 4225) that each tile is one block over all of
// d_model (fewer rows split d_model over up to 8 blocks; d_model ≤ 32 is one chunk, never split).
// Paths (mhc_fused.cu): d_model split (3 × 33, 5 × 4096, 9 × 7168, 37 × 300, 130 × 512, 6 × 129,
// 1001 × 256): kernel 2 sums the slices and runs the site math. One slice, d_model % 4 == 0 and
// aligned pointers (4500 × 100, 4300 × 2072, 4250 × 520, 100 × 32): kernel 1 runs the site math,
// kernel 2 only streams (2072: three float4 groups per thread, two batches for hc 4, the last
// group partial; 520: 160 threads; d_model 100 and 32: one warp, partly idle). One slice otherwise
// (1 × 1, 1 × 7, 4300 × 45, and those four in UnalignedPointersMatchCpu): kernel 2 runs the site
// math.
const std::vector<MhcShape> kBoundaryShapes = {
    MhcShape{1, 1, 4},      MhcShape{1, 7, 4},      MhcShape{3, 33, 4},    MhcShape{5, 4096, 4},
    MhcShape{9, 7168, 4},   MhcShape{37, 300, 2},   MhcShape{130, 512, 3}, MhcShape{6, 129, 1},
    MhcShape{1001, 256, 4}, MhcShape{4500, 100, 4}, MhcShape{4300, 45, 3}, MhcShape{4300, 2072, 4},
    MhcShape{4250, 520, 1}, MhcShape{100, 32, 3}};
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMhcPostPre, ::testing::ValuesIn(kBoundaryShapes));

// ---- mhc_pre_first ----

// The residual at the first site of a chunk: every stream a copy of stream 0 (embed_streams).
std::vector<float> first_site_h(const Boundary& b) {
    const int64_t D = b.d_model;
    std::vector<float> h = b.h;
    for (int64_t r = 0; r < b.rows; ++r)
        for (int j = 1; j < b.hc; ++j)
            std::copy_n(b.h.begin() + r * b.hc * D, D, h.begin() + (r * b.hc + j) * D);
    return h;
}

// mhc_pre (cuBLASLt GEMM) → rmsnorm on the whole h: the path mhc_pre_first replaces.
BoundaryOut gpu_pre_norm(const Boundary& b) {
    const std::vector<float>& h = b.h;
    const int64_t rows = b.rows, D = b.d_model, n_mix = (2 + b.hc) * b.hc;
    auto dfn = upload(b.next.fn), dbase = upload(b.next.base), dscale = upload(b.next.scale);
    auto dw = upload(b.norm_w), dh = upload(h);
    cuda::DeviceBuffer dpost(rows * b.hc * 4), dcomb(rows * b.hc * b.hc * 4);
    cuda::DeviceBuffer dx(rows * D * 2), dy(rows * D * 2), dmix(rows * n_mix * 4);
    ops::cuda::MhcDeviceParams p{
        dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), b.hc, D, 20, 1e-6f, 1e-6f};
    ops::cuda::GemmContext gemm;
    ops::cuda::mhc_pre(p, dh.as<float>(), rows, dpost.as<float>(), dcomb.as<float>(),
                       dx.as<__nv_bfloat16>(), gemm, dmix.as<float>(), nullptr);
    ops::cuda::rmsnorm(dx.as<__nv_bfloat16>(), rows, D, dw.as<float>(), 1e-6f,
                       dy.as<__nv_bfloat16>(), nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return {h, cuda::download_f32(dpost, rows * b.hc),
            cuda::download_f32(dcomb, rows * b.hc * b.hc), cuda::download_bf16(dy, rows * D)};
}

class CudaMhcPreFirst : public ::testing::TestWithParam<MhcShape> {};

// A first site's boundary: b's h with every stream a copy of stream 0.
Boundary first_site(const MhcShape& shape, uint64_t seed, bool bf16_values = false) {
    Boundary b = make_boundary(shape, seed);
    if (bf16_values)
        for (float& v : b.h) v = bf16_to_f32(f32_to_bf16(v));
    b.h = first_site_h(b);
    return b;
}

TEST_P(CudaMhcPreFirst, ReadsStreamZeroAloneAndMatchesPreNormAndCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 90));
    const Boundary b = first_site(GetParam(), 90);
    const BoundaryOut got = gpu_fused(b, {.op = FusedOp::PreFirst});
    expect_close(got, gpu_pre_norm(b), "mhc_pre + rmsnorm");
    expect_close(got, cpu_site(b, b.h, true), "CPU");
}

TEST_P(CudaMhcPreFirst, WithoutNormAndUnalignedMatchCpu) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 100));
    const Boundary b = first_site(GetParam(), 100);
    expect_close(gpu_fused(b, {.norm = false, .op = FusedOp::PreFirst}), cpu_site(b, b.h, false),
                 "CPU, no norm");
    expect_close(gpu_fused(b, {.offset = 1, .op = FusedOp::PreFirst}), cpu_site(b, b.h, true),
                 "CPU, unaligned");
}

// A bf16 residual holding the same (bf16) values: the same arithmetic, so post, comb and y are the
// fp32 residual's bit for bit, aligned or not.
TEST_P(CudaMhcPreFirst, Bf16ResidualEqualsFp32) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 110));
    const Boundary b = first_site(GetParam(), 110, true);
    for (size_t off : {size_t{0}, size_t{1}}) {
        const BoundaryOut f = gpu_fused(b, {.offset = off, .op = FusedOp::PreFirst});
        const BoundaryOut g =
            gpu_fused(b, {.offset = off, .bf16_h = true, .op = FusedOp::PreFirst});
        EXPECT_TRUE(f.post == g.post && f.comb == g.comb && f.y == g.y) << "offset " << off;
        expect_close(g, cpu_site(b, b.h, true), "CPU with a bf16 h");
    }
}

// The shapes (and so the paths) of CudaMhcPostPre.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMhcPreFirst, ::testing::ValuesIn(kBoundaryShapes));

// ---- mhc_post_pre_first ----

class CudaMhcPostPreFirst : public ::testing::TestWithParam<MhcShape> {};

// Streams 1 … hc − 1 NaN on the device: the result is mhc_post_pre's on the h with every stream
// written, bit for bit (h, post, comb, y), only if stream 0 alone was read; fp32 and bf16 h,
// aligned or not, with and without the norm; and the CPU's boundary.
TEST_P(CudaMhcPostPreFirst, ReadsStreamZeroAloneAndEqualsPostPre) {
    CPFILL_SKIP_WITHOUT_GPU();
    SCOPED_TRACE(describe(GetParam(), 120));
    for (bool bf16_h : {false, true}) {
        const Boundary b = first_site(GetParam(), 120, bf16_h);
        for (size_t off : {size_t{0}, size_t{1}})
            for (bool norm : {true, false}) {
                SCOPED_TRACE(::testing::Message()
                             << "bf16 h " << bf16_h << ", offset " << off << ", norm " << norm);
                const FusedOptions all{.norm = norm, .offset = off, .bf16_h = bf16_h};
                FusedOptions one = all;
                one.op = FusedOp::PostPreFirst;
                const BoundaryOut want = gpu_fused(b, all), got = gpu_fused(b, one);
                EXPECT_TRUE(got.h == want.h) << "h";
                EXPECT_TRUE(got.post == want.post && got.comb == want.comb) << "post / comb";
                EXPECT_TRUE(got.y == want.y) << "y";
                if (off != 0 || !norm) continue;
                if (bf16_h)
                    expect_bf16_residual_close(b, got, true);
                else
                    expect_close(got, cpu_boundary(b, true), "CPU");
            }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMhcPostPreFirst, ::testing::ValuesIn(kBoundaryShapes));

// ---- embed_streams ----

// Streams 0 … written − 1 of each row get the token's embedding (widened to fp32, or copied as
// bf16); the other streams keep what they held.
TEST(CudaEmbedStreams, WritesTheFirstStreamsAndLeavesTheRest) {
    CPFILL_SKIP_WITHOUT_GPU();
    const int64_t vocab = 11, D = 36;
    const int hc = 4;
    const std::vector<int32_t> tokens = {3, 0, 10, 3, 7};
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<uint16_t> table = to_bf16(random_f32(vocab * D, 7));
    auto dtable = upload(table), dtokens = upload(tokens);
    for (bool bf16_h : {false, true})
        for (int written : {1, 2, hc}) {
            SCOPED_TRACE(::testing::Message() << "bf16 h " << bf16_h << ", written " << written);
            const std::vector<uint16_t> before = to_bf16(random_f32(n * hc * D, 8));
            std::vector<float> h;  // after the call, widened
            if (bf16_h) {
                auto dh = upload(before);
                ops::cuda::embed_streams(dtable.as<__nv_bfloat16>(), dtokens.as<int32_t>(), n, D,
                                         hc, written, dh.as<__nv_bfloat16>(), nullptr);
                for (uint16_t v : download<uint16_t>(dh, before.size()))
                    h.push_back(bf16_to_f32(v));
            } else {
                std::vector<float> before_f;
                for (uint16_t v : before) before_f.push_back(bf16_to_f32(v));
                auto dh = upload(before_f);
                ops::cuda::embed_streams(dtable.as<__nv_bfloat16>(), dtokens.as<int32_t>(), n, D,
                                         hc, written, dh.as<float>(), nullptr);
                h = download<float>(dh, before_f.size());
            }
            size_t wrong = 0;
            for (int64_t t = 0; t < n; ++t)
                for (int j = 0; j < hc; ++j)
                    for (int64_t c = 0; c < D; ++c) {
                        const size_t i = static_cast<size_t>((t * hc + j) * D + c);
                        const uint16_t want = j < written ? table[tokens[t] * D + c] : before[i];
                        wrong += h[i] != bf16_to_f32(want);
                    }
            EXPECT_EQ(wrong, 0u) << "of " << h.size() << " values";
        }
}

// A count of streams outside 1 … hc is refused before anything runs (no GPU needed).
TEST(CudaEmbedStreams, WrittenOutsideOneToHcIsAnError) {
    for (int written : {0, 5, -1})
        EXPECT_THROW(ops::cuda::embed_streams(nullptr, nullptr, 0, 4096, 4, written,
                                              static_cast<float*>(nullptr), nullptr),
                     Error)
            << "written " << written;
    EXPECT_NO_THROW(ops::cuda::embed_streams(nullptr, nullptr, 0, 4096, 4, 1,
                                             static_cast<float*>(nullptr), nullptr));
}

TEST(CudaMhcPostPreEdge, ZeroRowsLaunchesNothing) {
    CPFILL_SKIP_WITHOUT_GPU();
    EXPECT_EQ(ops::cuda::mhc_post_pre_scratch_bytes(4, 4096, 0), 0);
    ops::cuda::MhcDeviceParams p{nullptr, nullptr, nullptr, 4, 4096, 20, 1e-6f, 1e-6f};
    ops::cuda::mhc_post_pre(nullptr, nullptr, nullptr, p, nullptr, 1e-6f, 0,
                            static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr,
                            nullptr);
    ops::cuda::mhc_post_pre(nullptr, nullptr, nullptr, p, nullptr, 1e-6f, 0,
                            static_cast<__nv_bfloat16*>(nullptr), nullptr, nullptr, nullptr,
                            nullptr, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaMhcPostPreEdge, ScratchBytes) {
    // Enough for any call of at most that many rows: 8192 rows need one slice per tile, but fewer
    // rows split d_model over up to 8 blocks per tile, within 264 blocks of 32 tokens (8448).
    EXPECT_EQ(ops::cuda::mhc_post_pre_scratch_bytes(4, 4096, 8192), 8448 * 25 * 4);
    EXPECT_EQ(ops::cuda::mhc_post_pre_scratch_bytes(4, 4096, 20000), 20000 * 25 * 4);
    // 1 row, 7168 channels: 8 slices.
    EXPECT_EQ(ops::cuda::mhc_post_pre_scratch_bytes(4, 7168, 1), 8 * 25 * 4);
    EXPECT_EQ(ops::cuda::mhc_post_pre_scratch_bytes(2, 70, 5), 8 * 5 * 9 * 4);
    EXPECT_THROW(ops::cuda::mhc_post_pre_scratch_bytes(5, 4096, 1), Error);
}
}  // namespace
}  // namespace cpfill
