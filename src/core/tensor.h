// Tensor: a non-owning view of up to 4 dimensions over memory on some device. Strides are in
// elements and the last dimension is always contiguous (stride 1). Quantized tensors are 2-D
// [rows, cols] with cols a multiple of the block size; a row's bytes are dtype_bytes(dtype, cols).
// Ownership lives elsewhere: a Buffer (backend.h), an mmap'd file (io/), or a std::vector.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"

namespace pagellm {

enum class Device : uint8_t { kCpu, kCuda };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, 4> shape{1, 1, 1, 1};
  std::array<int64_t, 4> stride{0, 0, 0, 0};  // elements; stride[ndim-1] == 1

  Tensor() = default;
  // Contiguous view of `shape` at `data`.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims, Device device = Device::kCpu)
      : data(data), dtype(dtype), device(device), ndim(static_cast<int>(dims.size())) {
    PAGELLM_CHECK(ndim >= 1 && ndim <= 4);
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
    set_contiguous_strides();
  }

  void set_contiguous_strides() {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      stride[i] = s;
      s *= shape[i];
    }
  }

  bool defined() const { return data != nullptr; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  // Number of rows when viewed as 2-D [rows, last dim].
  int64_t rows() const { return ndim == 0 ? 0 : numel() / shape[ndim - 1]; }
  int64_t cols() const { return ndim == 0 ? 0 : shape[ndim - 1]; }
  bool is_contiguous() const {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && stride[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
  // Stride between consecutive rows of the 2-D view, in elements; valid when the leading dims
  // are themselves contiguous with respect to each other (checked).
  int64_t row_stride() const {
    if (ndim == 1) return shape[0];
    for (int i = 0; i + 2 < ndim; ++i)
      PAGELLM_CHECK(shape[i] == 1 || stride[i] == stride[i + 1] * shape[i + 1]);
    return stride[ndim - 2];
  }
  int64_t nbytes() const {
    PAGELLM_CHECK(is_contiguous());
    return dtype_bytes(dtype, numel());
  }
  // Byte address of row r of the 2-D view.
  void* row_ptr(int64_t r) const {
    return static_cast<char*>(data) + dtype_bytes(dtype, r * row_stride());
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // Same memory, new shape; the view must be contiguous.
  Tensor reshape(std::initializer_list<int64_t> dims) const {
    PAGELLM_CHECK(is_contiguous());
    Tensor t(data, dtype, dims, device);
    PAGELLM_CHECK_MSG(t.numel() == numel(), "reshape changes the number of elements");
    return t;
  }
  // Rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const {
    PAGELLM_CHECK(begin >= 0 && begin <= end && end <= shape[0]);
    Tensor t = *this;
    t.data = static_cast<char*>(data) + dtype_bytes(dtype, begin * stride[0]);
    t.shape[0] = end - begin;
    return t;
  }
  // A 2-D [rows, heads * dim] view as [rows, heads, dim], keeping the row stride, so a column
  // slice of a wider buffer (q out of a fused q|k|v projection) can be addressed per head.
  Tensor split_heads(int64_t heads, int64_t dim) const {
    PAGELLM_CHECK(ndim == 2 && heads * dim == shape[1] && stride[1] == 1);
    Tensor t = *this;
    t.ndim = 3;
    t.shape = {shape[0], heads, dim, 1};
    t.stride = {stride[0], dim, 1, 0};
    return t;
  }
  // The same elements with dims 0 and 1 swapped (a strided view): [n, heads, dim] as
  // [heads, n, dim], each head a batch entry of batched_matmul.
  Tensor transpose01() const {
    PAGELLM_CHECK(ndim >= 2);
    Tensor t = *this;
    std::swap(t.shape[0], t.shape[1]);
    std::swap(t.stride[0], t.stride[1]);
    return t;
  }
  // Columns [begin, end) of the last dimension (a strided view).
  Tensor slice_cols(int64_t begin, int64_t end) const {
    PAGELLM_CHECK(!is_quantized(dtype));
    PAGELLM_CHECK(begin >= 0 && begin <= end && end <= shape[ndim - 1]);
    Tensor t = *this;
    t.data = static_cast<char*>(data) + dtype_bytes(dtype, begin);
    t.shape[ndim - 1] = end - begin;
    return t;
  }

  std::string shape_string() const;
};

}  // namespace pagellm
