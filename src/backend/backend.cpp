#include "backend/backend.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/cpu/memory_bandwidth.h"

namespace pagellm {

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(data(), dtype, shape, device());
  PAGELLM_CHECK_MSG(dtype_bytes(dtype, t.numel()) <= nbytes(), "Buffer::view larger than buffer");
  return t;
}

namespace {

// Host steady-clock timestamps, each taken after the backend has drained its queue.
class HostOpTimer final : public OpTimer {
 public:
  explicit HostOpTimer(Backend& backend) : backend_(backend) {}
  int mark() override {
    backend_.synchronize();
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double elapsed_ms(int a, int b) const override {
    PAGELLM_CHECK(a >= 0 && b >= 0 && a < static_cast<int>(marks_.size()) &&
                  b < static_cast<int>(marks_.size()));
    return std::chrono::duration<double, std::milli>(marks_[b] - marks_[a]).count();
  }
  void reset() override { marks_.clear(); }

 private:
  Backend& backend_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<OpTimer> Backend::make_op_timer() { return std::make_unique<HostOpTimer>(*this); }

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
