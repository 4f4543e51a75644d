#include "backend/backend.h"

#include <algorithm>
#include <chrono>

#include "backend/cpu/memory_bandwidth.h"

namespace pagellm {

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(data(), dtype, shape, device());
  PAGELLM_CHECK_MSG(dtype_bytes(dtype, t.numel()) <= nbytes(), "Buffer::view larger than buffer");
  return t;
}

double measure_memory_bandwidth_gbs(Backend& backend) {
  if (backend.device() == Device::kCpu) return measure_read_bandwidth_gbs();
  // 1 GiB each way, well past any cache; best of several copies.
  constexpr int64_t kBytes = int64_t{1} << 30;
  auto src = backend.allocate(kBytes), dst = backend.allocate(kBytes);
  backend.copy(dst->data(), src->data(), kBytes);  // warm-up
  backend.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    backend.copy(dst->data(), src->data(), kBytes);
    backend.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * kBytes / s / 1e9);
  }
  return best;
}

#ifndef PAGELLM_HAVE_CUDA
Result<std::unique_ptr<Backend>> make_cuda_backend(int) {
  return unimplemented("this build of pagellm has no CUDA backend (configure with --preset cuda)");
}
#endif

}  // namespace pagellm
