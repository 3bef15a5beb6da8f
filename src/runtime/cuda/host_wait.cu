// wait_stream: an event recorded on the stream, polled with a short sleep.
#include <thread>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/host_wait.h"

namespace cpfill::cuda {

void wait_stream(cudaStream_t stream, const AbortFlag& flag, std::chrono::milliseconds deadline,
                 const std::string& what) {
    cudaEvent_t ev = nullptr;
    CPFILL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    struct Guard {
        cudaEvent_t e;
        ~Guard() { cudaEventDestroy(e); }
    } guard{ev};
    CPFILL_CUDA_CHECK(cudaEventRecord(ev, stream));
    wait_event(ev, flag, deadline, what);
}

void wait_event(cudaEvent_t ev, const AbortFlag& flag, std::chrono::milliseconds deadline,
                const std::string& what, std::chrono::milliseconds spin) {
    const auto t0 = std::chrono::steady_clock::now();
    auto sleep = std::chrono::microseconds(5);
    for (;;) {
        cudaError_t st = cudaEventQuery(ev);
        if (st == cudaSuccess) return;
        if (st != cudaErrorNotReady)
            CPFILL_FAIL("{}: CUDA error {} ({})", what, cudaGetErrorName(st),
                        cudaGetErrorString(st));
        if (flag.raised()) CPFILL_FAIL("{}: stopped because {}", what, flag.why());
        const auto waited = std::chrono::steady_clock::now() - t0;
        if (waited > deadline)
            CPFILL_FAIL("{}: no progress within {} ms (a peer rank stalled or died?)", what,
                        deadline.count());
        if (waited < spin) {
            std::this_thread::yield();
            continue;
        }
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(200));
    }
}

}  // namespace cpfill::cuda
