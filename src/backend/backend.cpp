#include "backend/backend.h"

namespace pagellm {

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(data(), dtype, shape, device());
  PAGELLM_CHECK_MSG(dtype_bytes(dtype, t.numel()) <= nbytes(), "Buffer::view larger than buffer");
  return t;
}

#ifndef PAGELLM_HAVE_CUDA
Result<std::unique_ptr<Backend>> make_cuda_backend(int) {
  return unimplemented("this build of pagellm has no CUDA backend (configure with --preset cuda)");
}
#endif

}  // namespace pagellm
