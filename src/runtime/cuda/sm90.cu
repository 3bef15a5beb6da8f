// device_is_sm90, current_device_is_sm90 (runtime/cuda/sm90.h).
#include <cuda_runtime.h>

#include "runtime/cuda/sm90.h"

namespace cpfill::cuda {

bool device_is_sm90(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
}

bool current_device_is_sm90() {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess && device_is_sm90(dev);
}

}  // namespace cpfill::cuda
