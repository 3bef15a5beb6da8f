// Host waits on GPU work that can end in an error instead of a hang: poll an event with a deadline
// and a flag that a failing peer rank raises (docs/design.md: a rank that fails aborts the others).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

namespace cpfill::cuda {

// Raised once by the first rank that fails; every waiting rank sees it and stops.
class AbortFlag {
  public:
    void raise(const std::string& why) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!raised_.load()) why_ = why;
        raised_.store(true);
    }
    bool raised() const { return raised_.load(); }
    std::string why() const {
        std::lock_guard<std::mutex> lock(mu_);
        return why_;
    }

  private:
    std::atomic<bool> raised_{false};
    mutable std::mutex mu_;
    std::string why_;
};

// Blocks until everything queued on `stream` so far has run. Throws cpfill::Error on a CUDA
// error, when `flag` is raised ("stopped: rank … failed: …") or after `deadline` naming `what`.
void wait_stream(cudaStream_t stream, const AbortFlag& flag, std::chrono::milliseconds deadline,
                 const std::string& what);
// The same for an event already recorded. For its first `spin` it polls without sleeping (a
// sleep lasts at least the kernel's timer slack, ≈ 50 µs, and backs off to 200 µs): for waits on
// a prefill's critical path, which the host reaches early (the router's counts, once per layer).
void wait_event(cudaEvent_t event, const AbortFlag& flag, std::chrono::milliseconds deadline,
                const std::string& what,
                std::chrono::milliseconds spin = std::chrono::milliseconds(0));

}  // namespace cpfill::cuda
