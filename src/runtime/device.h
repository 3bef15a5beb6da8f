// GPU discovery that the CPU build can call too: how many CUDA devices this process sees and what
// they are. Returns 0 devices (with the reason) when cpfill was built without CUDA or no driver or
// GPU is present. No CUDA headers here (docs/conventions.md).
#pragma once

#include <string>

namespace cpfill {

struct CudaDeviceInfo {
    std::string name;
    int sm_count = 0;
    int major = 0, minor = 0;
    size_t total_bytes = 0;
    size_t free_bytes = 0;
};

// Number of usable CUDA devices; `why_none` (optional) says why it is 0.
int cuda_device_count(std::string* why_none);
CudaDeviceInfo cuda_device_info(int device);

// Throws cpfill::Error naming the reason when `--device cuda` cannot be used.
void require_cuda_device();

}  // namespace cpfill
