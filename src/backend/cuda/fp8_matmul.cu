// Fp8Matmul: cuBLASLt's FP8 GEMM on the device layout of FP8 weights. The row-major problem
// maps onto column-major cuBLASLt as gemm.cu's does: D [M, n] = A^T . B with A the weight's
// values (column-major [K, M], op T) and B the quantized x (column-major [K, n]). F8G128: each
// operand's scales are [K / 128][rows] f32, the layout cuBLASLt's VEC128_32F mode reads (outer
// dimension contiguous). F8Row: one scale a row, its first [rows] scales, and x one a token
// (OUTER_VEC_32F): on the H100, Llama-3-8B gate|up's shape ran at 1,058 TFLOP/s at 512 rows
// against VEC128's 878 (1,221 and 1,067 at 2,048).
#include "backend/cuda/fp8_matmul.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"

namespace pagellm::cuda {

Fp8Matmul::Fp8Matmul(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

Fp8Matmul::~Fp8Matmul() {
  for (auto& [key, p] : plans_) destroy(p);
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

bool Fp8Matmul::supported() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int dev) {
           int major = 0, minor = 0;
           CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
           CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
           return major * 10 + minor >= 89 ? 1 : 0;
         }) == 1;
}

int64_t Fp8Matmul::scratch_bytes(int64_t n, int64_t k) {
  // The scales start 256-byte aligned after the values.
  return (n * k + 255) / 256 * 256 + 4 * n * (k / 128);
}

const Fp8Matmul::Plan* Fp8Matmul::plan_for(int64_t n, int64_t m, int64_t k, const RowView& out,
                                           bool accumulate, bool per_row, const void* w_scales,
                                           const void* x_scales) {
  const bool out_aligned = reinterpret_cast<uintptr_t>(out.data) % 16 == 0;
  const Key key{n, m, k, out.ld, static_cast<int>(out.dtype), accumulate, out_aligned, per_row};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.desc != nullptr ? &it->second : nullptr;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  const cublasLtMatmulMatrixScale_t mode = per_row ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                   : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                              sizeof(mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                              sizeof(mode)));
  set_scales(p, w_scales, x_scales);  // the heuristic sees the call's pointers
  const cudaDataType_t d_type = out.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, k, n, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, d_type, m, n, out.ld));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    // Kept as an empty plan, so the shape is not asked again.
    destroy(p);
    plans_.emplace(key, Plan{});
    return nullptr;
  }
  p.algo = result.algo;
  return &plans_.emplace(key, p).first->second;
}

void Fp8Matmul::set_scales(const Plan& p, const void* w_scales, const void* x_scales) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &w_scales, sizeof(w_scales)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &x_scales, sizeof(x_scales)));
}

void Fp8Matmul::destroy(Plan& p) {
  if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d != nullptr) cublasLtMatrixLayoutDestroy(p.d);
  p = Plan{};
}

int64_t Fp8Matmul::run(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                       const RowView& out, bool accumulate, void* scratch) {
  const int64_t m = w.n_rows, k = w.cols;
  // cuBLASLt takes x's scales as rows of n floats 16-byte aligned: whole fours of rows.
  const int64_t n = x.n_rows / 4 * 4;
  if (n == 0 || m == 0) return 0;
  auto* xq = static_cast<uint8_t*>(scratch);
  auto* xs = reinterpret_cast<float*>(xq + (n * k + 255) / 256 * 256);
  const void* w_scales = static_cast<const uint8_t*>(w.data) + m * k;
  const RowView out_n{out.data, out.dtype, n, out.cols, out.ld};
  const bool per_row = w.dtype == DType::kF8Row;
  const Plan* plan = plan_for(n, m, k, out_n, accumulate, per_row, w_scales, xs);
  if (plan == nullptr) return 0;
  const Plan& p = *plan;
  launch_fp8_quantize_rows(RowView{x.data, x.dtype, n, x.cols, x.ld}, per_row, xq, xs, stream_);
  set_scales(p, w_scales, xs);
  // beta = 1 with C = D = out: out = x . w^T + out.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w.data, p.a, xq, p.b, &beta, out.data, p.d,
                              out.data, p.d, &p.algo, workspace_, kWorkspaceBytes, stream_));
  if (bias != nullptr) launch_add_bias(out_n, bias, bias_dtype, stream_);
  return n;
}

}  // namespace pagellm::cuda
