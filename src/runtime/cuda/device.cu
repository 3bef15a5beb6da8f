// cuda_device_count / cuda_device_info through the CUDA runtime.
#include <cstdlib>
#include <mutex>

#include "runtime/cuda/cuda_check.h"
#include "runtime/device.h"

namespace cpfill {

namespace {

// Eager module loading, unless the user chose otherwise. With lazy loading (CUDA's default since
// 12.2) the first launch of a kernel may wait for the whole device; if a peer rank has died, an
// NCCL kernel spins on that device waiting for it, and the launch never returns: the rank hangs
// before it can see the failure (found with scripts/gpu-fault-diag.sh; docs/parallel.md).
void choose_module_loading() {
    static std::once_flag once;
    std::call_once(once, [] { setenv("CUDA_MODULE_LOADING", "EAGER", 0); });
}

}  // namespace

int cuda_device_count(std::string* why_none) {
    choose_module_loading();  // before the CUDA runtime's first call initialises the driver
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why_none) *why_none = std::string("CUDA reports ") + cudaGetErrorString(err);
        cudaGetLastError();  // clear the sticky error
        return 0;
    }
    if (n == 0 && why_none) *why_none = "the CUDA runtime sees no GPU";
    return n;
}

CudaDeviceInfo cuda_device_info(int device) {
    cudaDeviceProp p{};
    CPFILL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    CudaDeviceInfo info;
    info.name = p.name;
    info.sm_count = p.multiProcessorCount;
    info.major = p.major;
    info.minor = p.minor;
    CPFILL_CUDA_CHECK(cudaSetDevice(device));
    CPFILL_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    return info;
}

}  // namespace cpfill
