// DeviceBuffer: RAII device memory (cudaMalloc / cudaFree) with typed views and host copies. The
// forward path takes its memory from buffers planned up front; tests and setup use these directly.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <vector>

#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes_) {
            cudaError_t err = cudaMalloc(&ptr_, bytes_);
            if (err != cudaSuccess) {
                size_t free_b = 0, total_b = 0;
                cudaGetLastError();
                cudaMemGetInfo(&free_b, &total_b);
                CPFILL_FAIL("out of GPU memory: needed {} bytes, {} of {} bytes free", bytes_,
                            free_b, total_b);
            }
        }
    }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFree(ptr_);
            ptr_ = o.ptr_;
            bytes_ = o.bytes_;
            o.ptr_ = nullptr;
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t bytes() const { return bytes_; }

  private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// Host fp32 → device bf16 (round to nearest even) and back.
DeviceBuffer upload_bf16(const float* host, size_t n);
DeviceBuffer upload_f32(const float* host, size_t n);
std::vector<float> download_bf16(const DeviceBuffer& b, size_t n);
std::vector<float> download_f32(const DeviceBuffer& b, size_t n);

}  // namespace cpfill::cuda
