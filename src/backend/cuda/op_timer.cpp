// CudaBackend's OpTimer: CUDA events recorded on the backend's stream, so each timestamp is taken
// by the GPU when the work queued before it has finished, not when the host queued it.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/check.h"

namespace pagellm::cuda {
namespace {

class EventOpTimer final : public OpTimer {
 public:
  explicit EventOpTimer(cudaStream_t stream) : stream_(stream) {}
  ~EventOpTimer() override {
    // Best effort: a destructor cannot report errors.
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  int mark() override {
    if (used_ == events_.size()) {  // events are made once and reused after reset()
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
    return static_cast<int>(used_++);
  }

  double elapsed_ms(int a, int b) const override {
    PAGELLM_CHECK(a >= 0 && b >= 0 && static_cast<size_t>(a) < used_ && static_cast<size_t>(b) < used_);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
    return ms;
  }

  void reset() override { used_ = 0; }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<OpTimer> CudaBackend::make_op_timer() { return std::make_unique<EventOpTimer>(stream_); }

}  // namespace pagellm::cuda
