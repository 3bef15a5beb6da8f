// Host tensor storage and shape helpers.
#include "core/tensor.h"

#include <fmt/ranges.h>

#include <cstring>

namespace cpfill {

int64_t shape_numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

Tensor Tensor::empty(DType dtype, Shape shape) {
    for (int64_t d : shape)
        CPFILL_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    size_t bytes = t.nbytes();
    auto buf = std::shared_ptr<std::byte[]>(new std::byte[bytes > 0 ? bytes : 1]);
    t.data_ = buf.get();
    t.holder_ = std::shared_ptr<const void>(buf, buf.get());
    t.owned_ = true;
    return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
    Tensor t = empty(dtype, std::move(shape));
    std::memset(t.raw_mut(), 0, t.nbytes());
    return t;
}

Tensor Tensor::borrow(DType dtype, Shape shape, const void* data,
                      std::shared_ptr<const void> keepalive) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.data_ = data;
    t.holder_ = std::move(keepalive);
    t.owned_ = false;
    return t;
}

void* Tensor::raw_mut() {
    if (!owned_) *this = clone();  // copy on write: a borrowed view is never written through
    return const_cast<void*>(data_);
}

Tensor Tensor::reshaped(Shape shape) const {
    CPFILL_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_),
                 shape_str(shape));
    Tensor t = *this;
    t.shape_ = std::move(shape);
    return t;
}

Tensor Tensor::clone() const {
    Tensor t = empty(dtype_, shape_);
    if (nbytes() > 0 && data_) std::memcpy(t.raw_mut(), data_, nbytes());
    return t;
}

void Tensor::check_type(size_t elem_size) const {
    CPFILL_CHECK(dtype_size(dtype_) == elem_size, "tensor of dtype {} accessed as {}-byte elements",
                 dtype_name(dtype_), elem_size);
}

}  // namespace cpfill
