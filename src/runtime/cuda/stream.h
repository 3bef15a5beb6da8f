// CudaStream and CudaEvent: move-only RAII owners of a CUDA stream and event (docs/conventions.md
// "Runtime abstractions"), with native() for the launchers. The streams are non-blocking (no
// implicit ordering with the legacy default stream); events are created without timing unless
// asked for.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

class CudaStream {
  public:
    CudaStream() { CPFILL_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~CudaStream() {
        if (s_) cudaStreamDestroy(s_);
    }
    CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    CudaStream& operator=(CudaStream&& o) noexcept {
        std::swap(s_, o.s_);
        return *this;
    }
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    cudaStream_t native() const { return s_; }
    operator cudaStream_t() const { return s_; }  // NOLINT: launchers take cudaStream_t

  private:
    cudaStream_t s_ = nullptr;
};

class CudaEvent {
  public:
    explicit CudaEvent(bool timing = false) {
        CPFILL_CUDA_CHECK(
            cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    ~CudaEvent() {
        if (e_) cudaEventDestroy(e_);
    }
    CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    CudaEvent& operator=(CudaEvent&& o) noexcept {
        std::swap(e_, o.e_);
        return *this;
    }
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    cudaEvent_t native() const { return e_; }
    // Marks the point of `s` reached so far.
    void record(cudaStream_t s) { CPFILL_CUDA_CHECK(cudaEventRecord(e_, s)); }
    // Later work on `s` waits for this event (on the device; the host does not block).
    void make_wait(cudaStream_t s) const { CPFILL_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }

  private:
    cudaEvent_t e_ = nullptr;
};

}  // namespace cpfill::cuda
