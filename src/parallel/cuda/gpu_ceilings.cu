// measure_gpu_ceilings: the yardsticks of docs/performance.md, measured in the same process as the
// benchmark (bf16 GEMM 8192³, device copy, all-gather at 1 GiB on two GPUs by NCCL and by the copy
// engines).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "ops/cuda/fp8.h"
#include "ops/cuda/gemm.h"
#include "parallel/gpu_prefill.h"
#include "runtime/cuda/buffer.h"
#include "runtime/cuda/ce_comm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/host_wait.h"
#include "runtime/cuda/nccl_comm.h"
#include "runtime/device.h"

namespace cpfill {

namespace {

// Median seconds of `reps` timed calls of fn on `stream`, after `warm` untimed ones.
template <class F>
double time_median(cudaStream_t stream, int warm, int reps, F fn) {
    for (int i = 0; i < warm; ++i) fn();
    cudaEvent_t a, b;
    CPFILL_CUDA_CHECK(cudaEventCreate(&a));
    CPFILL_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        CPFILL_CUDA_CHECK(cudaEventRecord(a, stream));
        fn();
        CPFILL_CUDA_CHECK(cudaEventRecord(b, stream));
        CPFILL_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CPFILL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e-3);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

__global__ void fill_bf16(__nv_bfloat16* x, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        x[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1024) / 1024.0f - 0.5f);
}

__global__ void fill_f32(float* x, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x)
        x[i] = static_cast<float>((i * 2654435761u) % 1024) / 1024.0f - 0.5f;
}

}  // namespace

GpuCeilings measure_gpu_ceilings() {
    GpuCeilings c;
    std::string why;
    const int n_dev = cuda_device_count(&why);
    CPFILL_CHECK(n_dev > 0, "no usable GPU: {}", why);
    CPFILL_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CPFILL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    {
        const int64_t n = 8192;
        cuda::DeviceBuffer a(n * n * 2), b(n * n * 2), y(n * n * 2);
        fill_bf16<<<1024, 256, 0, s>>>(a.as<__nv_bfloat16>(), n * n);  // never time on zeros
        fill_bf16<<<1024, 256, 0, s>>>(b.as<__nv_bfloat16>(), n * n);
        ops::cuda::GemmContext ctx;
        const double sec = time_median(s, 3, 10, [&] {
            ops::cuda::linear_bf16(ctx, a.as<__nv_bfloat16>(), n, n, b.as<__nv_bfloat16>(), n,
                                   y.as<__nv_bfloat16>(), nullptr, false, s);
        });
        c.gemm_tflops = 2.0 * n * n * n / sec * 1e-12;
        // fp8 with DeepSeek's blocks (128×128 weight tiles, 1×128 activation groups), the
        // dense linears' format: the activation is quantised once, outside the timing.
        cuda::DeviceBuffer wf(n * n * 4), wq(n * n), xq(n * n);
        cuda::DeviceBuffer ws(ops::cuda::fp8_weight_scales(n, n, ops::Fp8Blocks::Tile128) * 4),
            xs(n * (n / 128) * 4);
        fill_f32<<<1024, 256, 0, s>>>(wf.as<float>(), n * n);
        ops::cuda::quantize_weight_fp8(wf.as<float>(), n, n, ops::Fp8Blocks::Tile128, wq.as<void>(),
                                       ws.as<float>(), nullptr, s);
        ops::cuda::quantize_act_fp8(a.as<__nv_bfloat16>(), n, n, n, xq.as<void>(), xs.as<float>(),
                                    s);
        const double sec8 = time_median(s, 3, 10, [&] {
            ops::cuda::gemm_fp8(ctx, xq.as<void>(), xs.as<float>(), n, n, wq.as<void>(),
                                ws.as<float>(), ops::Fp8Blocks::Tile128, n, y.as<__nv_bfloat16>(),
                                nullptr, n, s);
        });
        c.fp8_gemm_tflops = 2.0 * n * n * n / sec8 * 1e-12;
    }
    {
        const size_t bytes = size_t{1} << 30;
        cuda::DeviceBuffer a(bytes), b(bytes);
        CPFILL_CUDA_CHECK(cudaMemsetAsync(a.as<void>(), 1, bytes, s));
        const double sec = time_median(s, 2, 10, [&] {
            CPFILL_CUDA_CHECK(
                cudaMemcpyAsync(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice, s));
        });
        c.hbm_gbps = 2.0 * bytes / sec * 1e-9;
    }
    CPFILL_CUDA_CHECK(cudaStreamDestroy(s));
    if (n_dev < 2) return c;
    // All-gather of 1 GiB in all (512 MiB per rank) on GPUs 0 and 1, one thread each: by NCCL,
    // then by the copy engines (CeComm; send and receive buffers in one registered area).
    const int n = 2;
    const int64_t total = int64_t{1} << 30, per = total / n;
    ncclUniqueId id;
    CPFILL_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::shared_ptr<cuda::CeGroup> ce_group = cuda::make_ce_group(n);
    const auto busbw = [&](bool ce) {
        std::vector<double> secs(n);
        std::vector<std::string> errors(n);
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r)
            threads.emplace_back([&, r] {
                try {
                    CPFILL_CUDA_CHECK(cudaSetDevice(r));
                    cudaStream_t st;
                    CPFILL_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
                    std::unique_ptr<cuda::DeviceComm> comm;
                    if (ce)
                        comm = std::make_unique<cuda::CeComm>(ce_group, r);
                    else
                        comm = std::make_unique<cuda::NcclComm>(r, n, id);
                    cuda::DeviceBuffer area(per + total);
                    char* send = area.as<char>();
                    char* recv = send + per;
                    const cuda::AbortFlag flag;
                    comm->use_buffers(area.as<void>(), area.bytes(), nullptr, 0, flag,
                                      std::chrono::milliseconds(60000));
                    CPFILL_CUDA_CHECK(cudaMemsetAsync(send, r + 1, per, st));
                    secs[r] = time_median(st, 3, 10, [&] {
                        comm->all_gather(send, recv, per, cuda::CommData::Bytes, st);
                    });
                    CPFILL_CUDA_CHECK(cudaStreamSynchronize(st));
                    cudaStreamDestroy(st);
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                }
            });
        for (auto& t : threads) t.join();
        for (const auto& e : errors)
            CPFILL_CHECK(e.empty(), "all-gather ceiling ({}): {}", ce ? "copy engines" : "NCCL", e);
        return double(total) / std::max(secs[0], secs[1]) * (n - 1) / n * 1e-9;
    };
    c.allgather_busbw_gbps = busbw(false);
    c.allgather_gpus = n;
    // A GPU pair the copy engines cannot serve leaves that ceiling out rather than the run.
    try {
        c.ce_allgather_busbw_gbps = busbw(true);
    } catch (const std::exception& e) {
        fmt::print(stderr, "ceilings: copy-engine all-gather not measured: {}\n", e.what());
    }
    return c;
}

}  // namespace cpfill
