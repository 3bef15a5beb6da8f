// Arena: one device allocation carved into the buffers a prefill needs, planned up front
// (docs/conventions.md: no cudaMalloc in the layer loop). take<T>(n) hands out 256-byte aligned
// slices in order; asking for more than was planned is an error naming both sizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cuda/buffer.h"

namespace cpfill::cuda {

constexpr size_t kArenaAlign = 256;

inline size_t arena_round(size_t bytes) {
    return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

class Arena {
  public:
    Arena() = default;
    explicit Arena(size_t bytes) : buf_(bytes) {}
    template <class T>
    T* take(int64_t n) {
        const size_t bytes = arena_round(static_cast<size_t>(n < 0 ? 0 : n) * sizeof(T));
        CPFILL_CHECK(used_ + bytes <= buf_.bytes(),
                     "device workspace overrun: {} bytes planned, {} needed (a planning bug)",
                     buf_.bytes(), used_ + bytes);
        T* p = reinterpret_cast<T*>(buf_.as<char>() + used_);
        used_ += bytes;
        return p;
    }
    void reset() { used_ = 0; }  // hand the same memory out again (the next run's plan)
    void* base() const { return buf_.as<void>(); }
    size_t used() const { return used_; }
    size_t capacity() const { return buf_.bytes(); }

  private:
    DeviceBuffer buf_;
    size_t used_ = 0;
};

}  // namespace cpfill::cuda
