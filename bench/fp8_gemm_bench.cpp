// fp8 against bf16 GEMMs through cuBLASLt at DeepSeek-V4 shapes: TFLOP/s of gemm_bf16, gemm_fp8
// with 128×128 weight tiles (the dense linears as shipped) and with 1×128 weight blocks (the
// experts re-encoded from fp4), and the rate of the activation quantisation (GB/s of bf16 read).
// Usage: fp8_gemm_bench [--reps N]. Prints a Markdown table; docs/performance-notes.md keeps it.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <vector>

#include "ops/cuda/fp8.h"
#include "ops/cuda/gemm.h"
#include "runtime/cuda/buffer.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/time_ms.h"

namespace {

using namespace cpfill;
namespace oc = ops::cuda;
using cuda::time_ms;  // runtime/cuda/time_ms.h

struct Shape {
    int64_t m, n, k;  // tokens × out × in
    const char* what;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app("fp8 vs bf16 GEMMs at V4 shapes");
    int reps = 20;
    app.add_option("--reps", reps, "timed launches per case")->check(CLI::Range(1, 1000));
    CLI11_PARSE(app, argc, argv);
    try {
        const std::vector<Shape> shapes = {{8192, 8192, 8192, "square"},
                                           {16384, 4096, 4096, "dense projection, 16k tokens"},
                                           {1536, 4096, 4096, "expert gate_up, 64k tokens"},
                                           {1536, 4096, 2048, "expert down, 64k tokens"},
                                           {16384, 32768, 1024, "wq_b-like"}};
        fmt::print("| M×N×K | what | bf16 TFLOP/s | fp8 tile128 | fp8 row128 | act quant GB/s |\n");
        fmt::print("|---|---|---:|---:|---:|---:|\n");
        oc::GemmContext ctx;
        for (const Shape& s : shapes) {
            cuda::DeviceBuffer x(s.m * s.k * 2), w(s.n * s.k * 2), y(s.m * s.n * 2);
            cuda::DeviceBuffer xq(s.m * s.k), wq(s.n * s.k), xs(s.m * (s.k / 128) * 4);
            cuda::DeviceBuffer wt(oc::fp8_weight_scales(s.n, s.k, oc::Fp8Blocks::Tile128) * 4);
            cuda::DeviceBuffer wr(oc::fp8_weight_scales(s.n, s.k, oc::Fp8Blocks::Row128) * 4);
            cuda::DeviceBuffer wf(s.n * s.k * 4);
            // Values do not change the rate; zeros would (sparsity of work is not a thing here,
            // but keep them finite and non-zero): 0x3c00 bf16 = 1.0, 0x3f800000 f32 = 1.0.
            CPFILL_CUDA_CHECK(cudaMemset(x.as<void>(), 0x3c, x.bytes()));
            CPFILL_CUDA_CHECK(cudaMemset(w.as<void>(), 0x3c, w.bytes()));
            CPFILL_CUDA_CHECK(cudaMemset(wf.as<void>(), 0x3c, wf.bytes()));
            oc::quantize_weight_fp8(wf.as<float>(), s.n, s.k, oc::Fp8Blocks::Tile128, wq.as<void>(),
                                    wt.as<float>(), nullptr, nullptr);
            oc::quantize_weight_fp8(wf.as<float>(), s.n, s.k, oc::Fp8Blocks::Row128, wq.as<void>(),
                                    wr.as<float>(), nullptr, nullptr);
            oc::quantize_act_fp8(x.as<__nv_bfloat16>(), s.k, s.m, s.k, xq.as<void>(),
                                 xs.as<float>(), nullptr);
            const double flop = 2.0 * s.m * s.n * s.k;
            const double bf = time_ms(
                [&] {
                    oc::linear_bf16(ctx, x.as<__nv_bfloat16>(), s.m, s.k, w.as<__nv_bfloat16>(),
                                    s.n, y.as<__nv_bfloat16>(), nullptr, false, nullptr);
                },
                reps);
            auto fp8 = [&](oc::Fp8Blocks b, const cuda::DeviceBuffer& sc) {
                return time_ms(
                    [&] {
                        oc::gemm_fp8(ctx, xq.as<void>(), xs.as<float>(), s.m, s.k, wq.as<void>(),
                                     sc.as<float>(), b, s.n, y.as<__nv_bfloat16>(), nullptr, s.n,
                                     nullptr);
                    },
                    reps);
            };
            std::string tile, row;
            try {
                tile = fmt::format("{:.0f}", flop / fp8(oc::Fp8Blocks::Tile128, wt) / 1e9);
            } catch (const Error& e) {
                tile = "no algorithm";
            }
            try {
                row = fmt::format("{:.0f}", flop / fp8(oc::Fp8Blocks::Row128, wr) / 1e9);
            } catch (const Error& e) {
                row = "no algorithm";
            }
            const double q = time_ms(
                [&] {
                    oc::quantize_act_fp8(x.as<__nv_bfloat16>(), s.k, s.m, s.k, xq.as<void>(),
                                         xs.as<float>(), nullptr);
                },
                reps);
            fmt::print("| {}×{}×{} | {} | {:.0f} | {} | {} | {:.0f} |\n", s.m, s.n, s.k, s.what,
                       flop / bf / 1e9, tile, row, s.m * s.k * 2.0 / q / 1e6);
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    }
    return 0;
}
