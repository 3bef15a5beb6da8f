// current_device_is_sm90 (runtime/cuda/sm90.h).
#include <cuda_runtime.h>

#include "runtime/cuda/sm90.h"

namespace cpfill::cuda {

bool current_device_is_sm90() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
}

}  // namespace cpfill::cuda
