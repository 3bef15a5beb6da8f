// cuda_device_count and friends for a build without the CUDA backend.
#include "core/error.h"
#include "runtime/device.h"

#ifndef CPFILL_HAVE_CUDA
namespace cpfill {

int cuda_device_count(std::string* why_none) {
    if (why_none) *why_none = "this cpfill was built without the CUDA backend (no nvcc found)";
    return 0;
}

CudaDeviceInfo cuda_device_info(int device) {
    CPFILL_FAIL("no CUDA device {}: this cpfill was built without the CUDA backend", device);
}

}  // namespace cpfill
#endif

namespace cpfill {

void require_cuda_device() {
    std::string why;
    CPFILL_CHECK(cuda_device_count(&why) > 0, "--device cuda: no usable GPU: {}", why);
}

}  // namespace cpfill
