// fill_random: the same values as the CPU backend (random_uniform_at in backend.h, a pure function
// of seed and index), generated in device memory so `--load-format dummy` builds an 8B-parameter
// model in well under a second instead of copying 16 GB from the host.
#include "backend/backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(random_uniform_at(seed, static_cast<uint64_t>(i), lo, hi));
  }
}

}  // namespace

void launch_fill_random(void* data, DType dtype, int64_t n, uint64_t seed, float lo, float hi,
                        cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(n, threads), 65536);
  dispatch_float_type(dtype, [&](auto t) {
    using T = decltype(t);
    fill_random_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<T*>(data), n, seed, lo, hi);
  });
}

}  // namespace pagellm::cuda
