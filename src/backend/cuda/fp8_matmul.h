// FP8 weights past the FP8 GEMV's rows on FP8 tensor cores (sm_89+): out (+)= x . w^T with x
// quantized to e4m3 first and cuBLASLt's FP8 GEMM reading the weight's values and scales where
// the device layout keeps them (fp8_gemm.cu), fp32 accumulation, bf16 or f32 out. F8G128
// weights: x gets one scale per row and 128 columns (the recipe DeepSeek-V3's checkpoints are
// made for), both operands' scales 128-value vectors along K (VEC128_32F). F8Row weights (one
// scale a row: per-tensor and per-channel checkpoints): x gets one scale a row (per token), both
// operands' scales vectors over their rows (OUTER_VEC_32F), the faster kernels.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/kernels.h"

namespace pagellm::cuda {

class Fp8Matmul {
 public:
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  explicit Fp8Matmul(cudaStream_t stream);
  ~Fp8Matmul();
  Fp8Matmul(const Fp8Matmul&) = delete;
  Fp8Matmul& operator=(const Fp8Matmul&) = delete;

  // Whether the current device has FP8 tensor cores (compute capability 8.9 or later).
  static bool supported();

  // Bytes of the quantized copy of n rows of x with K columns (values, then scales).
  static int64_t scratch_bytes(int64_t n, int64_t k);

  // out (+)= x . w^T + bias for the first rows of x, w an F8G128 weight in the device layout;
  // `scratch` (scratch_bytes) receives x quantized. Bias is added by a kernel after the product.
  // Returns the rows done: x's rows rounded down to a multiple of 4 (cuBLASLt's alignment of the
  // scales), or 0 (nothing queued) when cuBLASLt has no FP8 kernel for the operands (an output's
  // stride or alignment, say).
  int64_t run(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
              const RowView& out, bool accumulate, void* scratch);

 private:
  // Shape, out type and stride, whether the product is added (beta), whether out is 16-byte
  // aligned, whether the scales are per row (F8Row).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, bool, bool>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The plan for these operands (made on first use: the heuristic's first algorithm), or null
  // when cuBLASLt has none.
  const Plan* plan_for(int64_t n, int64_t m, int64_t k, const RowView& out, bool accumulate,
                       bool per_row, const void* w_scales, const void* x_scales);
  static void set_scales(const Plan& p, const void* w_scales, const void* x_scales);
  static void destroy(Plan& p);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace pagellm::cuda
