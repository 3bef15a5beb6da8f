// cuda_device_count / cuda_device_info through the CUDA runtime.
#include "runtime/cuda/cuda_check.h"
#include "runtime/device.h"

namespace cpfill {

int cuda_device_count(std::string* why_none) {
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
