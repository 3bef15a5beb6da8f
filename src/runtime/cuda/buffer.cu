// Host ↔ device copies with bf16 conversion on the host (setup and tests, not the hot path).
#include <cstring>

#include "core/dtype.h"
#include "runtime/cuda/buffer.h"

namespace cpfill::cuda {

DeviceBuffer upload_bf16(const float* host, size_t n) {
    std::vector<uint16_t> tmp(n);
    for (size_t i = 0; i < n; ++i) tmp[i] = f32_to_bf16(host[i]);
    DeviceBuffer b(n * 2);
    CPFILL_CUDA_CHECK(cudaMemcpy(b.as<void>(), tmp.data(), n * 2, cudaMemcpyHostToDevice));
    return b;
}

DeviceBuffer upload_f32(const float* host, size_t n) {
    DeviceBuffer b(n * 4);
    CPFILL_CUDA_CHECK(cudaMemcpy(b.as<void>(), host, n * 4, cudaMemcpyHostToDevice));
    return b;
}

std::vector<float> download_bf16(const DeviceBuffer& b, size_t n) {
    std::vector<uint16_t> tmp(n);
    CPFILL_CUDA_CHECK(cudaMemcpy(tmp.data(), b.as<void>(), n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(tmp[i]);
    return out;
}

std::vector<float> download_f32(const DeviceBuffer& b, size_t n) {
    std::vector<float> out(n);
    CPFILL_CUDA_CHECK(cudaMemcpy(out.data(), b.as<void>(), n * 4, cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace cpfill::cuda
