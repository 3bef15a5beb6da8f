// Host tensors: a dtype, a shape and bytes, either owned or borrowed from a longer-lived buffer
// (an mmap of a checkpoint). Row-major, contiguous. The CPU backend works on F32 tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace cpfill {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

class Tensor {
  public:
    Tensor() = default;
    static Tensor empty(DType dtype, Shape shape);  // uninitialised
    static Tensor zeros(DType dtype, Shape shape);
    // A view of memory owned by `keepalive` (which must outlive nothing: the Tensor holds it).
    static Tensor borrow(DType dtype, Shape shape, const void* data,
                         std::shared_ptr<const void> keepalive);

    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
    int ndim() const { return static_cast<int>(shape_.size()); }
    int64_t numel() const { return shape_numel(shape_); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
    bool defined() const { return data_ != nullptr || numel() == 0; }

    const void* raw() const { return data_; }
    // Mutable bytes. A borrowed (read-only) view is first copied into owned memory, so writing
    // never touches the mapping it came from; use the const accessors to read without a copy.
    void* raw_mut();

    template <class T>
    const T* data() const {
        check_type(sizeof(T));
        return static_cast<const T*>(data_);
    }
    template <class T>
    T* data() {
        check_type(sizeof(T));
        return static_cast<T*>(raw_mut());
    }
    const float* f32() const { return data<float>(); }
    float* f32() { return data<float>(); }

    // Same bytes, new shape with equal element count.
    Tensor reshaped(Shape shape) const;
    // Deep copy into owned memory.
    Tensor clone() const;

  private:
    void check_type(size_t elem_size) const;

    DType dtype_ = DType::F32;
    Shape shape_;
    std::shared_ptr<const void> holder_;
    const void* data_ = nullptr;
    bool owned_ = false;
};

}  // namespace cpfill
