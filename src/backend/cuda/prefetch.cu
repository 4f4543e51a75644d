// L2 prefetch of a span of device memory: the CUDA side of Backend::prefetch. Nothing is read
// into registers; the memory system is asked to bring the span into L2, so a later kernel that
// reads it finds it there. Launched on a side branch beside latency-bound kernels (RoPE, decode
// attention), which leave the memory bandwidth idle at decode, it moves the next projection's
// weight stream into that idle time.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

// One prefetch request per thread and chunk: sm_90's bulk prefetch (one instruction for a whole
// chunk, served by the SM's copy engine), else one L2 prefetch per 128-byte line.
constexpr int64_t kChunk = 16384;
constexpr int kThreads = 32;

__global__ void l2_prefetch_kernel(const char* base, int64_t bytes) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kChunk;
  for (int64_t off = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kChunk;
       off < bytes; off += stride) {
    const int64_t len = bytes - off < kChunk ? bytes - off : kChunk;  // a multiple of 16
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off),
                 "r"(static_cast<uint32_t>(len))
                 : "memory");
#else
    for (int64_t line = 0; line < len; line += 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off + line));
#endif
  }
}

}  // namespace

void launch_l2_prefetch(const void* data, int64_t bytes, int n_sms, cudaStream_t stream) {
  // The bulk form wants a 16-byte-aligned start and a size in multiples of 16: trim the span to
  // that (the few bytes left out are a hint's loss, not an error).
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const uintptr_t start = (addr + 15) & ~uintptr_t{15};
  const int64_t usable = (bytes - static_cast<int64_t>(start - addr)) & ~int64_t{15};
  if (usable <= 0) return;
  const int64_t chunks = (usable + kChunk - 1) / kChunk;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(ceil_div(chunks, kThreads), std::max(n_sms, 1)));
  l2_prefetch_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const char*>(start), usable);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
