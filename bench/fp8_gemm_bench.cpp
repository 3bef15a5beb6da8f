// fp8 against bf16 GEMMs through cuBLASLt at DeepSeek-V4 shapes: TFLOP/s of gemm_bf16, gemm_fp8
// with 128×128 weight tiles (the dense linears as shipped) and with 1×128 weight blocks (the
// experts re-encoded from fp4), and the rate of the activation quantisation (GB/s of bf16 read).
// Then the routed experts of one layer at 64k tokens (E experts of R rows each): the grouped fp8
// kernel (ops/cuda/grouped_fp8.h, one launch) with each of its epilogues (registers, TMA stores)
// against a cuBLASLt GEMM per expert on one stream; then the same experts in bf16 (the grouped
// kernel's two tile shapes against cuBLASLt per expert).
// Usage: fp8_gemm_bench [--reps N] [--experts E] [--rows R] [--grouped-only]. Prints Markdown
// tables; docs/performance-notes.md keeps them.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/fp8.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_fp8.h"
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

// Gate_up (out 2 · 2048, in 4096) and down (out 4096, in 2048) of V4-Flash's experts, E experts of
// `rows` rows each.
void grouped_experts(int E, int64_t rows, int reps) {
    fmt::print(
        "\n| experts × rows | GEMM (out × in) | grouped fp8 TFLOP/s, registers epilogue | "
        "grouped fp8, tma_store epilogue | per-expert cuBLASLt fp8 |\n");
    fmt::print("|---|---|---:|---:|---:|\n");
    oc::GemmContext ctx;
    for (const auto& [n, k, what] : {std::tuple{int64_t{4096}, int64_t{4096}, "gate_up"},
                                     std::tuple{int64_t{4096}, int64_t{2048}, "down"}}) {
        const int64_t total = E * rows;
        cuda::DeviceBuffer xq(total * k), xs(total * (k / 128) * 4), y(total * n * 2);
        cuda::DeviceBuffer wq(E * n * k);
        const int64_t spm = oc::fp8_weight_scales(n, k, oc::Fp8Blocks::Tile128);
        cuda::DeviceBuffer ws(E * spm * 4);
        std::vector<int32_t> pfirst(E + 1);
        for (int e = 0; e <= E; ++e) pfirst[e] = static_cast<int32_t>(e * rows);
        cuda::DeviceBuffer dpf(pfirst.size() * 4);
        CPFILL_CUDA_CHECK(
            cudaMemcpy(dpf.as<void>(), pfirst.data(), pfirst.size() * 4, cudaMemcpyHostToDevice));
        CPFILL_CUDA_CHECK(cudaMemset(xq.as<void>(), 0x38, xq.bytes()));  // e4m3 1.0
        CPFILL_CUDA_CHECK(cudaMemset(wq.as<void>(), 0x38, wq.bytes()));
        const std::vector<float> ones(std::max(total * (k / 128), E * spm), 1.0f / 64);
        CPFILL_CUDA_CHECK(
            cudaMemcpy(xs.as<void>(), ones.data(), xs.bytes(), cudaMemcpyHostToDevice));
        CPFILL_CUDA_CHECK(
            cudaMemcpy(ws.as<void>(), ones.data(), ws.bytes(), cudaMemcpyHostToDevice));
        oc::GroupedFp8Gemm g;
        g.x = xq.as<void>();
        g.xs = xs.as<float>();
        g.n_pad = total;
        g.pfirst = dpf.as<int32_t>();
        g.n_experts = E;
        g.w = wq.as<void>();
        g.ws = ws.as<float>();
        g.ws_per_expert = spm;
        g.in = k;
        g.out = n;
        g.y = y.as<__nv_bfloat16>();
        const double flop = 2.0 * total * n * k;
        std::string grouped[2] = {"not this GPU", "not this GPU"};
        const oc::GroupedFp8Epilogue epilogues[2] = {oc::GroupedFp8Epilogue::Registers,
                                                     oc::GroupedFp8Epilogue::TmaStore};
        for (int v = 0; v < 2 && oc::grouped_fp8_supported(); ++v) {
            g.epilogue = epilogues[v];
            grouped[v] = fmt::format(
                "{:.0f}", flop / time_ms([&] { oc::grouped_gemm_fp8(g, nullptr); }, reps) / 1e9);
        }
        const double per = time_ms(
            [&] {
                for (int e = 0; e < E; ++e)
                    oc::gemm_fp8(ctx, xq.as<uint8_t>() + e * rows * k,
                                 xs.as<float>() + e * rows * (k / 128), rows, k,
                                 wq.as<uint8_t>() + e * n * k, ws.as<float>() + e * spm,
                                 oc::Fp8Blocks::Tile128, n, y.as<__nv_bfloat16>() + e * rows * n,
                                 nullptr, n, nullptr);
            },
            reps);
        fmt::print("| {} × {} | {} ({} × {}) | {} | {} | {:.0f} |\n", E, rows, what, n, k,
                   grouped[0], grouped[1], flop / per / 1e9);
    }
}

// The same experts in bf16: the grouped kernel with its wide (128 × 256) and tall (256 × 128)
// tiles against a cuBLASLt GEMM per expert, TFLOP/s, and the weights' bytes over the time of the
// faster grouped launch (GB/s: at few rows per expert the launch is bound by reading them).
void grouped_experts_bf16(int E, int64_t rows, int reps) {
    fmt::print(
        "\n| experts × rows | GEMM (out × in) | grouped bf16 TFLOP/s, 128×256 tiles "
        "| 256×128 tiles | per-expert cuBLASLt bf16 | weights GB/s (faster grouped) |\n");
    fmt::print("|---|---|---:|---:|---:|---:|\n");
    oc::GemmContext ctx;
    for (const auto& [n, k, what] : {std::tuple{int64_t{4096}, int64_t{4096}, "gate_up"},
                                     std::tuple{int64_t{4096}, int64_t{2048}, "down"}}) {
        const int64_t total = E * rows;
        cuda::DeviceBuffer x(total * k * 2), w(E * n * k * 2), y(total * n * 2);
        CPFILL_CUDA_CHECK(cudaMemset(x.as<void>(), 0x3c, x.bytes()));  // bf16 ≈ 1
        CPFILL_CUDA_CHECK(cudaMemset(w.as<void>(), 0x3c, w.bytes()));
        std::vector<int32_t> first(E + 1);
        for (int e = 0; e <= E; ++e) first[e] = static_cast<int32_t>(e * rows);
        cuda::DeviceBuffer dfirst(first.size() * 4);
        CPFILL_CUDA_CHECK(
            cudaMemcpy(dfirst.as<void>(), first.data(), first.size() * 4, cudaMemcpyHostToDevice));
        oc::GroupedBf16Gemm g;
        g.x = x.as<__nv_bfloat16>();
        g.rows = total;
        g.first = dfirst.as<int32_t>();
        g.n_experts = E;
        g.w = w.as<__nv_bfloat16>();
        g.in = k;
        g.out = n;
        g.y = y.as<__nv_bfloat16>();
        const double flop = 2.0 * total * n * k;
        std::string grouped[2] = {"not this GPU", "not this GPU"};
        double best_ms = 0;
        const oc::GroupedBf16Tile tiles[2] = {oc::GroupedBf16Tile::Wide, oc::GroupedBf16Tile::Tall};
        for (int v = 0; v < 2 && oc::grouped_fp8_supported(); ++v) {
            g.tile = tiles[v];
            const double ms = time_ms([&] { oc::grouped_gemm_bf16(g, nullptr); }, reps);
            best_ms = v == 0 ? ms : std::min(best_ms, ms);
            grouped[v] = fmt::format("{:.0f}", flop / ms / 1e9);
        }
        const double per = time_ms(
            [&] {
                for (int e = 0; e < E; ++e)
                    oc::linear_bf16(ctx, x.as<__nv_bfloat16>() + e * rows * k, rows, k,
                                    w.as<__nv_bfloat16>() + e * n * k, n,
                                    y.as<__nv_bfloat16>() + e * rows * n, nullptr, false, nullptr);
            },
            reps);
        fmt::print("| {} × {} | {} ({} × {}) | {} | {} | {:.0f} | {} |\n", E, rows, what, n, k,
                   grouped[0], grouped[1], flop / per / 1e9,
                   best_ms > 0 ? fmt::format("{:.0f}", E * n * k * 2.0 / best_ms / 1e6) : "–");
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app("fp8 vs bf16 GEMMs at V4 shapes");
    int reps = 20, experts = 256;
    int64_t rows = 1536;
    bool grouped_only = false;
    app.add_option("--reps", reps, "timed launches per case")->check(CLI::Range(1, 1000));
    app.add_option("--experts", experts, "routed experts of the grouped case")
        ->check(CLI::Range(1, 1024));
    app.add_option("--rows", rows, "rows per expert of the grouped case (a multiple of 4)")
        ->check(CLI::Range(4, 1 << 20));
    app.add_flag("--grouped-only", grouped_only, "only the routed experts' table");
    CLI11_PARSE(app, argc, argv);
    try {
        if (grouped_only) {
            grouped_experts(experts, rows / 4 * 4, reps);
            grouped_experts_bf16(experts, rows / 4 * 4, reps);
            return 0;
        }
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
        grouped_experts(experts, rows / 4 * 4, reps);
        grouped_experts_bf16(experts, rows / 4 * 4, reps);
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    }
    return 0;
}
