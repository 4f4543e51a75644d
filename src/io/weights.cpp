#include "io/weights.h"

#include <string>

namespace pagellm {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

Result<Tensor> WeightSource::get(const std::string& name,
                                 std::vector<int64_t> expected_shape) const {
  const TensorInfo* info = find(name);
  if (!info) return not_found("tensor '" + name + "' not found in " + description());
  if (!expected_shape.empty() && info->shape != expected_shape) {
    return invalid_argument(info->file + ": tensor '" + name + "' has shape " +
                            shape_str(info->shape) + ", expected " + shape_str(expected_shape));
  }
  if (info->shape.size() > 4) {
    return unimplemented(info->file + ": tensor '" + name + "' has " +
                         std::to_string(info->shape.size()) +
                         " dimensions; at most 4 are supported");
  }
  Tensor t;
  // The mapping is read-only: the view is for reading (and uploading) only.
  t.data = const_cast<void*>(info->data);
  t.dtype = info->dtype;
  t.device = Device::kCpu;
  if (info->shape.empty()) {
    t.ndim = 1;  // a scalar is viewed as one element
    t.shape[0] = 1;
  } else {
    t.ndim = static_cast<int>(info->shape.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = info->shape[i];
  }
  if (is_quantized(t.dtype) && t.cols() % block_elems(t.dtype) != 0) {
    return invalid_argument(info->file + ": tensor '" + name + "' of type " +
                            std::string(dtype_name(t.dtype)) + " has a last dimension " +
                            std::to_string(t.cols()) + " that is not a multiple of " +
                            std::to_string(block_elems(t.dtype)));
  }
  t.set_contiguous_strides();
  return t;
}

}  // namespace pagellm
