// PhaseTimer: CUDA events recorded between phases of the compute stream.
#include "model/cuda/gpu_context.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

PhaseTimer::~PhaseTimer() {
    for (cudaEvent_t e : all_) cudaEventDestroy(e);
}

cudaEvent_t PhaseTimer::record(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    CPFILL_CUDA_CHECK(cudaEventCreate(&e));
    all_.push_back(e);
    CPFILL_CUDA_CHECK(cudaEventRecord(e, s));
    return e;
}

void PhaseTimer::begin(Phase p, cudaStream_t s) {
    if (!enabled_ || p == running_) return;
    cudaEvent_t now = record(s);
    if (running_ != Phase::kCount) spans_.push_back({running_, {start_, now}});
    running_ = p;
    start_ = now;
}

void PhaseTimer::end(cudaStream_t s) {
    if (!enabled_ || running_ == Phase::kCount) return;
    spans_.push_back({running_, {start_, record(s)}});
    running_ = Phase::kCount;
}

void PhaseTimer::mark_layer(cudaStream_t s) {
    if (enabled_) layers_.push_back(record(s));
}

std::vector<double> PhaseTimer::phase_seconds() const {
    std::vector<double> out(static_cast<size_t>(Phase::kCount), 0.0);
    for (const auto& [p, ev] : spans_) {
        float ms = 0;
        CPFILL_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.first, ev.second));
        out[static_cast<size_t>(p)] += ms * 1e-3;
    }
    return out;
}

std::vector<double> PhaseTimer::layer_seconds() const {
    std::vector<double> out;
    for (size_t i = 0; i + 1 < layers_.size(); ++i) {
        float ms = 0;
        CPFILL_CUDA_CHECK(cudaEventElapsedTime(&ms, layers_[i], layers_[i + 1]));
        out.push_back(ms * 1e-3);
    }
    return out;
}

}  // namespace cpfill::cuda
