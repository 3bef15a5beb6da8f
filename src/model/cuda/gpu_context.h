// What the GPU model functions (gpu_attention.h, gpu_moe.h) run with: the rank's compute stream,
// its cuBLASLt context, the activation scratch of fp8 linears, the abort flag and deadline for the
// few host waits, and an optional phase timer (CUDA events on the compute stream, rank 0 only).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <vector>

#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/gemm.h"
#include "runtime/cuda/host_wait.h"

namespace cpfill::cuda {

enum class Phase { Attention, Indexer, Compressor, Moe, Collectives, Other, kCount };

// Records (phase, start, end) event pairs on a stream; elapsed times are read after the run.
class PhaseTimer {
  public:
    explicit PhaseTimer(bool enabled) : enabled_(enabled) {}
    ~PhaseTimer();
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;
    bool enabled() const { return enabled_; }
    void begin(Phase p, cudaStream_t s);  // ends the running phase, starts p
    void end(cudaStream_t s);             // ends the running phase
    void mark_layer(cudaStream_t s);      // a layer boundary
    // Seconds per phase and between consecutive layer marks (call after the stream finished).
    std::vector<double> phase_seconds() const;
    std::vector<double> layer_seconds() const;

  private:
    cudaEvent_t record(cudaStream_t s);
    bool enabled_;
    Phase running_ = Phase::kCount;
    cudaEvent_t start_ = nullptr;
    std::vector<std::pair<Phase, std::pair<cudaEvent_t, cudaEvent_t>>> spans_;
    std::vector<cudaEvent_t> layers_;
    std::vector<cudaEvent_t> all_;
};

struct GpuCtx {
    cudaStream_t stream = nullptr;
    ops::cuda::GemmContext* gemm = nullptr;
    const ops::cuda::Fp8LinearScratch* fp8 = nullptr;  // for fp8 weights (the workspace's)
    const AbortFlag* flag = nullptr;
    std::chrono::milliseconds deadline{600000};
    PhaseTimer* timer = nullptr;
    void phase(Phase p) const {
        if (timer && timer->enabled()) timer->begin(p, stream);
    }
};

}  // namespace cpfill::cuda
