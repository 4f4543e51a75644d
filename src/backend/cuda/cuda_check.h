// Error checks for CUDA runtime and cuBLAS calls. A failing call is a broken invariant of the
// process (a bad launch, a lost device, memory corruption): it aborts with the call's text, the
// error's name and description, and the file and line, rather than continuing on a poisoned
// context. Errors that user input can cause are turned into a Status before any CUDA call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace pagellm::cuda {

[[noreturn]] void cuda_failed(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void cublas_failed(cublasStatus_t st, const char* call, const char* file, int line);

}  // namespace pagellm::cuda

#define CUDA_CHECK(call)                                                                    \
  do {                                                                                      \
    const cudaError_t _err = (call);                                                        \
    if (_err != cudaSuccess) ::pagellm::cuda::cuda_failed(_err, #call, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                            \
  do {                                                                \
    const cublasStatus_t _st = (call);                                \
    if (_st != CUBLAS_STATUS_SUCCESS)                                 \
      ::pagellm::cuda::cublas_failed(_st, #call, __FILE__, __LINE__); \
  } while (0)

namespace pagellm::cuda {
// Whether `stream` is being recorded into a graph (which cannot allocate or synchronize).
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  return st != cudaStreamCaptureStatusNone;
}
}  // namespace pagellm::cuda

// After a kernel launch: reports bad launch configurations at the launch site. Execution errors
// surface at the next synchronizing call (run under compute-sanitizer to pin them down).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
