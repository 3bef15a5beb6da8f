// Helpers of the CUDA-vs-CPU op tests: skip without a GPU, bf16-exact random inputs, uploads of
// integer tensors, error reports (max abs/rel error, worst index, first (actual, expected) pairs)
// and event timing for the "[ timing ]" lines some tests print (information, never pass/fail).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "runtime/cuda/buffer.h"
#include "runtime/cuda/sm90.h"
#include "runtime/cuda/time_ms.h"
#include "runtime/device.h"

#define CPFILL_SKIP_WITHOUT_GPU()                              \
    do {                                                       \
        std::string why;                                       \
        if (cuda_device_count(&why) == 0) GTEST_SKIP() << why; \
    } while (0)

// Also skips without a GPU of compute capability 9.0: the Hopper kernels (wgmma, TMA; sm_90a).
#define CPFILL_SKIP_WITHOUT_SM90()                          \
    do {                                                    \
        CPFILL_SKIP_WITHOUT_GPU();                          \
        if (!::cpfill::cuda::current_device_is_sm90())      \
            GTEST_SKIP() << "needs compute capability 9.0"; \
    } while (0)

namespace cpfill::test_cuda {

// Normal(0, scale) values rounded to bf16, so host and device see the same numbers.
inline std::vector<float> random_bf16(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    return v;
}

inline std::vector<float> random_f32(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    cuda::DeviceBuffer b(v.size() * sizeof(T));
    if (!v.empty())
        CPFILL_CUDA_CHECK(
            cudaMemcpy(b.as<void>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    if (n)
        CPFILL_CUDA_CHECK(
            cudaMemcpy(v.data(), b.as<void>(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Max abs error, and that error relative to the largest |expected| (the tensor's scale).
struct Diff {
    double max_abs = 0, rel = 0;
    size_t worst = 0;
    std::string pairs;  // the worst and the first few (actual, expected) pairs

    std::string str() const {
        std::ostringstream s;
        s << "max abs " << max_abs << ", rel " << rel << " at " << worst << "; " << pairs;
        return s.str();
    }
};

inline Diff diff(const std::vector<float>& actual, const std::vector<float>& expected) {
    Diff d;
    double scale = 0;
    EXPECT_EQ(actual.size(), expected.size());
    const size_t n = std::min(actual.size(), expected.size());
    for (size_t i = 0; i < n; ++i) {
        scale = std::max(scale, double(std::abs(expected[i])));
        const double e = std::abs(double(actual[i]) - expected[i]);
        if (!(e <= d.max_abs)) {  // NaN counts as worst
            d.max_abs = e;
            d.worst = i;
        }
    }
    d.rel = scale > 0 ? d.max_abs / scale : d.max_abs;
    std::ostringstream s;
    if (n) s << "worst (" << actual[d.worst] << ", " << expected[d.worst] << "), first";
    for (size_t i = 0; i < std::min<size_t>(n, 4); ++i)
        s << " (" << actual[i] << ", " << expected[i] << ")";
    d.pairs = s.str();
    return d;
}

// Prints "[ error ] <test> <what>: rel …, abs …" so a run's log holds the errors, not just
// pass/fail.
inline Diff print_diff(const char* what, Diff d) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::printf("[ error ] %s.%s %s: rel %.2e, abs %.2e\n", info->test_suite_name(), info->name(),
                what, d.rel, d.max_abs);
    return d;
}

using cuda::time_ms;  // runtime/cuda/time_ms.h

// Host quantisation of a 128-block as the fp8 activation kernels define it: scale amax / 448 (1
// when all are 0), each value / scale rounded to e4m3.
inline float quantise_block(const float* v, uint8_t* q) {
    float amax = 0.0f;
    for (int k = 0; k < 128; ++k) amax = std::max(amax, std::abs(v[k]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int k = 0; k < 128; ++k) q[k] = f32_to_e4m3(v[k] / s);
    return s;
}

}  // namespace cpfill::test_cuda
