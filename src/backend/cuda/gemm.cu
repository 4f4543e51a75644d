// cuBLASLt GEMM with cached heuristics, plus the tiled fallback kernel.
//
// Mapping the row-major problem onto column-major cuBLASLt: a row-major [r, c] matrix with row
// stride ld is, byte for byte, a column-major [c, r] matrix with leading dimension ld. So
//   out (row-major [n, M], ld ldo)  = D, column-major [M, n]
//   w   (row-major [M, K], ld ldw)  = A stored column-major [K, M], used transposed (op T)
//   x   (row-major [n, K], ld ldx)  = B stored column-major [K, n], used as is (op N)
// and D[M, n] = A^T[M, K] . B[K, n] is exactly out = x . w^T. The bias epilogue adds a vector of
// D's row count (M) to every column of D, i.e. bias[m] to every token's output m.
#include "backend/cuda/gemm.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cuda/device_utils.cuh"
#include "core/log.h"

namespace pagellm::cuda {
namespace {

// Largest power of two (capped at 256, cuBLASLt's default assumption) dividing the address:
// strided output slices can start at any element, and algorithms needing more are excluded.
uint32_t alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (u % a) != 0) a >>= 1;
  return a;
}

// The alignment every entry of a strided batch keeps: its first entry's, and that of the byte
// step between entries (a step of 0 keeps any alignment).
uint32_t batched_alignment_of(const void* p, int64_t stride_elems, int64_t elem_bytes) {
  uint32_t a = alignment_of(p);
  const uint64_t step = static_cast<uint64_t>(stride_elems) * static_cast<uint64_t>(elem_bytes);
  while (a > 1 && step % a != 0) a >>= 1;
  return a;
}

// preload_kernels: the row counts it plans for, the buckets (9 to max_rows rows cut into
// multiples of 8 up to 1,024 rows, of 64 up to 4,096 and of 256 above, each planned for its top
// row count), and the rows it runs each kernel on. Every multiple of 8 for all sizes would have
// start-up plan thousands of buckets; these stay within a few percent of any row count, so a
// bucket's kernel suits all of its rows.
constexpr int64_t kPreloadRows = 64;
int64_t bucket_top(int64_t n) {
  const int64_t q = n <= 1024 ? 8 : n <= 4096 ? 64 : 256;
  return (n + q - 1) / q * q;
}
// PAGELLM_GEMM_PRELOAD=0: no preloading, every plan the heuristic's (to measure what it buys).
bool preload_enabled() {
  static const bool on = tuning::on("PAGELLM_GEMM_PRELOAD");
  return on;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: PAGELLM_CHECK_MSG(false, "gemm: unsupported dtype");
  }
  return CUDA_R_32F;
}

// --- fallback: 16x16 output tile per block, K in steps of 16 through shared memory ---
constexpr int kTile = 16;

template <typename TW, typename TOut, typename TB>
__global__ void gemm_fallback_kernel(const bf16* __restrict__ x, int64_t ldx,
                                     const TW* __restrict__ w, int64_t ldw,
                                     const TB* __restrict__ bias, TOut* __restrict__ out,
                                     int64_t ldo, int64_t n, int64_t m_dim, int64_t k_dim,
                                     bool accumulate) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;  // token
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;  // output feature
  const int64_t wrow = static_cast<int64_t>(blockIdx.x) * kTile + ty;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k_dim; k0 += kTile) {
    xs[ty][tx] = (row < n && k0 + tx < k_dim) ? to_float(x[row * ldx + k0 + tx]) : 0.0f;
    ws[ty][tx] = (wrow < m_dim && k0 + tx < k_dim) ? to_float(w[wrow * ldw + k0 + tx]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += xs[ty][kk] * ws[tx][kk];
    __syncthreads();
  }
  if (row < n && col < m_dim) {
    if (bias != nullptr) acc += to_float(bias[col]);
    if (accumulate) acc += to_float(out[row * ldo + col]);
    out[row * ldo + col] = from_float<TOut>(acc);
  }
}

}  // namespace

void launch_gemm_fallback(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                          const RowView& out, cudaStream_t stream, bool accumulate) {
  const int64_t n = x.n_rows, k_dim = x.cols, m_dim = w.n_rows;
  if (n == 0 || m_dim == 0) return;
  const dim3 grid(ceil_div(m_dim, kTile), ceil_div(n, kTile));
  PAGELLM_CHECK_MSG(grid.y <= 65535, "gemm fallback: too many rows for one launch");
  const dim3 block(kTile, kTile);
  dispatch_float_type(w.dtype, [&](auto tw) {
    using TW = decltype(tw);
    dispatch_float_type(out.dtype, [&](auto to) {
      using TOut = decltype(to);
      dispatch_float_type(bias ? bias_dtype : DType::kF32, [&](auto tb) {
        using TB = decltype(tb);
        gemm_fallback_kernel<TW, TOut, TB><<<grid, block, 0, stream>>>(
            static_cast<const bf16*>(x.data), x.ld, static_cast<const TW*>(w.data), w.ld,
            static_cast<const TB*>(bias), static_cast<TOut*>(out.data), out.ld, n, m_dim, k_dim,
            accumulate);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

Gemm::Gemm(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) destroy(plan);
  for (auto& [key, plan] : batched_plans_) destroy(plan);
  if (workspace_ != nullptr) cudaFree(workspace_);  // no CHECK in a destructor: best effort
  if (flush_ != nullptr) cudaFree(flush_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void Gemm::destroy(Plan& p) {
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  p = Plan{};
}

void Gemm::make_descriptors(Plan& p, const RowView& x, const RowView& w, const void* bias,
                            DType bias_dtype, const RowView& out, const GemmBatch& batch) {
  const int64_t n = x.n_rows, k_dim = x.cols, m_dim = w.n_rows;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = cuda_type(bias_dtype);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
    // The heuristic reads the bias pointer's alignment from its value.
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  }
  p.bias_in_epilogue = bias != nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k_dim, m_dim, w.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k_dim, n, x.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, cuda_type(out.dtype), m_dim, n, out.ld));
  if (batch.count > 1) {
    const int32_t count = static_cast<int32_t>(batch.count);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {p.a, batch.stride_w}, {p.b, batch.stride_x}, {p.d, batch.stride_out}};
    for (const auto& [layout, stride] : layouts) {
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof(count)));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
}

bool Gemm::query_algos(const Plan& p, const uint32_t align[4], int want,
                       std::vector<cublasLtMatmulAlgo_t>& algos) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws_bytes = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof(ws_bytes)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                    &align[0], sizeof(uint32_t)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                    &align[1], sizeof(uint32_t)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                    &align[2], sizeof(uint32_t)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                    &align[2], sizeof(uint32_t)));
  // Split-K only with its partial sums kept in f32 in the workspace. The in-place and output-type
  // reductions add the partials through the output (bf16), rounding each at the partials' size:
  // an output that nearly cancels moves by whole bf16 steps of its partials. The heuristic may
  // offer them: on an H100, matmul_add at 19 x 4096 x 4096 gave outputs near 0.2 on the 2^-7 grid
  // of bf16 numbers near 1, up to 0.007 off. Algorithms without split-K (scheme NONE, 0) pass any
  // mask.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(want, 1));
  int n_results = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref,
                                     static_cast<int>(results.size()), results.data(), &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  // "No algorithm" (NOT_SUPPORTED or zero results) is an answer, not an error: the caller retries
  // without the epilogue, then falls back to the tiled kernel.
  if (st != CUBLAS_STATUS_SUCCESS || n_results == 0 || results[0].state != CUBLAS_STATUS_SUCCESS) {
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED &&
        st != CUBLAS_STATUS_INVALID_VALUE)
      cublas_failed(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    return false;
  }
  algos.clear();
  for (int i = 0; i < n_results; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  return true;
}

namespace {

// One algorithm's configuration as cuBLASLt reports it, for the debug log: which kernel a plan
// runs, and whether it splits K and how it reduces the splits.
template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};  // stays 0 where the attribute cannot be read
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

void log_algo(const RowView& x, const RowView& w, const cublasLtMatmulAlgo_t& algo) {
  if (log_level() > LogLevel::kDebug) return;
  PAGELLM_LOG_DEBUG(
      "gemm: %lld x %lld x %lld plans algo %d (tile %u, stages %u, split-K %d, reduction %u, "
      "swizzle %u, custom %u, inner shape %u, cluster %u)",
      static_cast<long long>(x.n_rows), static_cast<long long>(w.n_rows),
      static_cast<long long>(x.cols), algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
      algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
      algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
      static_cast<unsigned>(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
      static_cast<unsigned>(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)));
}

}  // namespace

bool Gemm::try_make_plan(Plan& p, const RowView& x, const RowView& w, const void* bias,
                         DType bias_dtype, const RowView& out, const uint32_t align[4],
                         const GemmBatch& batch, int want, std::vector<cublasLtMatmulAlgo_t>* all) {
  make_descriptors(p, x, w, bias, bias_dtype, out, batch);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (!query_algos(p, align, want, algos)) {
    destroy(p);
    return false;
  }
  p.algo = algos[0];
  log_algo(x, w, p.algo);
  if (all != nullptr) *all = std::move(algos);
  return true;
}

Gemm::KnownShape* Gemm::find_shape(const Shape& shape) {
  const auto it = std::find_if(shapes_.begin(), shapes_.end(),
                               [&](const KnownShape& k) { return k.shape == shape; });
  return it == shapes_.end() ? nullptr : &*it;
}

bool Gemm::plan_from_bucket(Plan& p, const RowView& x, const RowView& w, const void* bias,
                            DType bias_dtype, const RowView& out, const GemmBatch& batch,
                            const Shape& shape) {
  if (x.n_rows <= kGemvMaxRows) return false;
  const KnownShape* known = find_shape(shape);
  if (known == nullptr) return false;
  const auto b = known->buckets.find(bucket_top(x.n_rows));
  // A bucket planned without the bias epilogue (cuBLASLt had none with it) would need other
  // descriptors: such plans are made as before.
  if (b == known->buckets.end() || b->second.bias_in_epilogue != (bias != nullptr)) return false;
  Plan q;
  make_descriptors(q, x, w, bias, bias_dtype, out, batch);
  q.algo = b->second.algo;
  if (!loaded(kernel_of(q, shape)) || !algo_fits(q, q.algo)) {
    destroy(q);
    return false;
  }
  q.provisional = true;
  p = q;
  return true;
}

Gemm::Plan& Gemm::keep_provisional(Plan& kept, const Shape& shape) {
  pending_.push_back({&kept, shape});
  return kept;
}

void Gemm::refine(Plan& p, const Shape& shape) {
  p.provisional = false;
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (!query_algos(p, shape.align, 1, algos)) return;  // the bucket's algorithm stays
  Plan exact = p;
  exact.algo = algos[0];
  if (loaded(kernel_of(exact, shape))) p.algo = exact.algo;
}

void Gemm::refine_if_capturing(Plan& p) {
  if (!p.provisional) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  if (capturing == cudaStreamCaptureStatusNone) return;
  for (size_t i = pending_head_; i < pending_.size(); ++i) {
    if (pending_[i].plan == &p) {
      refine(p, pending_[i].shape);  // its pending entry then does nothing
      return;
    }
  }
}

bool Gemm::refine_plans(cudaStream_t busy) {
  while (pending_head_ < pending_.size()) {
    // Only while the device still has queued work: then the host would only wait.
    const cudaError_t st = cudaStreamQuery(busy);
    if (st != cudaErrorNotReady) {
      if (st != cudaSuccess) return true;  // an error of earlier work: its own check reports it
      break;
    }
    PendingPlan& next = pending_[pending_head_++];
    if (next.plan->provisional) refine(*next.plan, next.shape);
  }
  // "Not ready" is an answer, not an error; keep it out of the runtime's last error.
  if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
  if (pending_head_ == pending_.size()) {
    pending_.clear();
    pending_head_ = 0;
  }
  return pending_head_ < pending_.size();
}

Gemm::Plan& Gemm::plan_for(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                           const RowView& out) {
  const uint32_t align[4] = {alignment_of(w.data), alignment_of(x.data), alignment_of(out.data),
                             bias ? alignment_of(bias) : 0u};
  const Key key{x.n_rows, x.cols,     w.n_rows,
                x.ld,     w.ld,       out.ld,
                static_cast<int>(out.dtype), bias ? static_cast<int>(bias_dtype) : -1,
                align[0], align[1],   align[2],
                align[3]};
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    refine_if_capturing(it->second);
    return it->second;
  }
  const Shape shape = shape_of(x, w, out, bias, bias_dtype, align, GemmBatch{});
  Plan p;
  if (plan_from_bucket(p, x, w, bias, bias_dtype, out, GemmBatch{}, shape))
    return keep_provisional(plans_.emplace(key, p).first->second, shape);
  if (!try_make_plan(p, x, w, bias, bias_dtype, out, align) &&
      !(bias != nullptr && try_make_plan(p, x, w, nullptr, bias_dtype, out, align)))
    p.use_fallback = true;
  if (!p.use_fallback && x.n_rows > kGemvMaxRows) settle_algo(p, shape, x.n_rows);
  return plans_.emplace(key, p).first->second;
}

bool Gemm::algo_fits(const Plan& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t check{};
  return cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.d, p.d, &algo, &check) ==
             CUBLAS_STATUS_SUCCESS &&
         check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes;
}

Gemm::Shape Gemm::shape_of(const RowView& x, const RowView& w, const RowView& out, const void* bias,
                           DType bias_dtype, const uint32_t align[4], const GemmBatch& batch) {
  return Shape{x.cols,         w.n_rows,
               x.ld,           w.ld,
               out.ld,         out.dtype,
               bias_dtype,     w.data,
               bias,           {align[0], align[1], align[2], align[3]},
               batch.count,    batch.stride_x,
               batch.stride_w, batch.stride_out};
}

// Which weights (of this shape) a plan reads does not matter, only whether it has a bias.
bool Gemm::Shape::operator==(const Shape& o) const {
  return k_dim == o.k_dim && m_dim == o.m_dim && ldx == o.ldx && ldw == o.ldw && ldo == o.ldo &&
         out_dtype == o.out_dtype && bias_dtype == o.bias_dtype &&
         (bias != nullptr) == (o.bias != nullptr) && std::equal(align, align + 4, o.align) &&
         batch == o.batch && stride_x == o.stride_x && stride_w == o.stride_w &&
         stride_out == o.stride_out;
}

Gemm::KernelKey Gemm::kernel_of(const Plan& p, const Shape& s) {
  return KernelKey{p.algo, s.out_dtype, p.bias_in_epilogue ? s.bias_dtype : DType::kF32,
                   p.bias_in_epilogue, s.batch > 1};
}

bool Gemm::KernelKey::operator==(const KernelKey& o) const {
  return same_algo(algo, o.algo) && out_dtype == o.out_dtype && bias_dtype == o.bias_dtype &&
         bias_in_epilogue == o.bias_in_epilogue && batched == o.batched;
}

bool Gemm::loaded(const KernelKey& k) const {
  return std::find(loaded_.begin(), loaded_.end(), k) != loaded_.end();
}

void Gemm::settle_algo(Plan& p, const Shape& shape, int64_t n) {
  KnownShape* it = find_shape(shape);
  if (it == nullptr) it = &shapes_.emplace_back(KnownShape{shape, {}});
  KernelKey k = kernel_of(p, shape);
  if (!it->buckets.empty() && !loaded(k)) {
    // The heuristic's kernel for exactly n rows was never run: its first call would hold the host
    // while cuBLASLt loads it. The bucket's kernel, loaded by preload_kernels, runs instead.
    const auto b = it->buckets.find(bucket_top(n));
    if (b != it->buckets.end() && b->second.bias_in_epilogue == p.bias_in_epilogue &&
        algo_fits(p, b->second.algo)) {
      p.algo = b->second.algo;
      k = kernel_of(p, shape);
    }
  }
  if (loaded(k)) return;
  if (!it->buckets.empty())
    PAGELLM_LOG_DEBUG("gemm: %lld x %lld x %lld (batch %lld) runs a kernel not preloaded",
                      static_cast<long long>(n), static_cast<long long>(shape.k_dim),
                      static_cast<long long>(shape.m_dim), static_cast<long long>(shape.batch));
  loaded_.push_back(k);  // the plan runs right after: its kernel is loaded then
}

void Gemm::preload_kernels(int64_t max_rows) {
  if (!preload_enabled() || shapes_.empty() || max_rows <= kGemvMaxRows) return;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t loaded_before = loaded_.size();
  // Scratch for x and out of every shape on kPreloadRows rows (all batch entries).
  const auto extent = [](const Shape& s, int64_t ld, int64_t stride, int64_t cols) {
    return (s.batch - 1) * stride + (kPreloadRows - 1) * ld + cols;
  };
  int64_t x_bytes = 0, out_bytes = 0;
  for (const auto& [s, buckets] : shapes_) {
    x_bytes = std::max(x_bytes, extent(s, s.ldx, s.stride_x, s.k_dim) * 2);
    out_bytes =
        std::max(out_bytes, extent(s, s.ldo, s.stride_out, s.m_dim) * dtype_bytes(s.out_dtype, 1));
  }
  void* xs = nullptr;
  void* os = nullptr;
  if (cudaMalloc(&xs, x_bytes) != cudaSuccess || cudaMalloc(&os, out_bytes) != cudaSuccess) {
    cudaGetLastError();  // no room: the kernels load on first use, as before
    if (xs != nullptr) cudaFree(xs);
    return;
  }
  CUDA_CHECK(cudaMemsetAsync(xs, 0, x_bytes, stream_));
  CUDA_CHECK(cudaMemsetAsync(os, 0, out_bytes, stream_));  // read by the accumulating runs
  int64_t n_plans = 0;
  for (KnownShape& known : shapes_) {
    const Shape& s = known.shape;
    const RowView w{const_cast<void*>(s.w), DType::kBF16, s.m_dim, s.k_dim, s.ldw};
    const GemmBatch batch{s.batch, s.stride_x, s.stride_w, s.stride_out};
    // A plan for `rows` rows of the scratch, made as plan_for or run_batched makes one (the bias
    // in the epilogue where cuBLASLt takes it).
    const auto make = [&](Plan& p, int64_t rows) {
      const RowView x{xs, DType::kBF16, rows, s.k_dim, s.ldx};
      const RowView out{os, s.out_dtype, rows, s.m_dim, s.ldo};
      return try_make_plan(p, x, w, s.bias, s.bias_dtype, out, s.align, batch) ||
             (s.bias != nullptr &&
              try_make_plan(p, x, w, nullptr, s.bias_dtype, out, s.align, batch));
    };
    for (int64_t top = bucket_top(kGemvMaxRows + 1); top <= bucket_top(max_rows);
         top = bucket_top(top + 1)) {
      Plan bucket;  // the heuristic's choice for the bucket's top row count
      ++n_plans;
      if (!make(bucket, top)) continue;
      known.buckets[top] = BucketAlgo{bucket.algo, bucket.bias_in_epilogue};
      const KernelKey k = kernel_of(bucket, s);
      destroy(bucket);
      if (loaded(k)) continue;
      Plan run;  // the same algorithm on kPreloadRows rows
      if (!make(run, kPreloadRows)) continue;
      if (run.bias_in_epilogue == k.bias_in_epilogue && algo_fits(run, k.algo)) {
        run.algo = k.algo;
        // Both the plain product and the accumulating one (run_add: beta = 1), in case the
        // library keeps a kernel for each.
        for (const bool accumulate : {false, true})
          run_plan(run, RowView{xs, DType::kBF16, kPreloadRows, s.k_dim, s.ldx}, w,
                   k.bias_in_epilogue ? s.bias : nullptr, s.bias_dtype,
                   RowView{os, s.out_dtype, kPreloadRows, s.m_dim, s.ldo}, accumulate);
        loaded_.push_back(k);  // only once it has run: a kernel that could not stays lazy
      }
      destroy(run);
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaFree(xs);
  cudaFree(os);
  PAGELLM_LOG_DEBUG(
      "gemm: %zu kernels preloaded for %zu shapes (%lld bucket plans) in %.1f ms",
      loaded_.size() - loaded_before, shapes_.size(), static_cast<long long>(n_plans),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

std::vector<cublasLtMatmulAlgo_t> Gemm::candidates(const RowView& x, const RowView& w,
                                                   const RowView& out, int max) {
  const uint32_t align[4] = {alignment_of(w.data), alignment_of(x.data), alignment_of(out.data),
                             0u};
  Plan p;
  std::vector<cublasLtMatmulAlgo_t> all;
  if (try_make_plan(p, x, w, nullptr, DType::kF32, out, align, GemmBatch{}, max, &all)) destroy(p);
  return all;
}

void Gemm::run_candidate(const RowView& x, const RowView& w, const RowView& out,
                         const cublasLtMatmulAlgo_t& algo) {
  Plan p = plan_for(x, w, nullptr, DType::kF32, out);  // its descriptors, cached
  PAGELLM_CHECK_MSG(!p.use_fallback, "gemm: cuBLASLt has no algorithm for this product");
  p.algo = algo;
  p.use_gemv = false;
  run_plan(p, x, w, nullptr, DType::kF32, out);
}

void Gemm::choose_gemv(Plan& p, const RowView& x, const RowView& w, const void* bias,
                       DType bias_dtype, const RowView& out) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return;
  // Decode reads every weight from HBM once per step, so time each candidate with the weights
  // out of L2: before every run, overwrite a buffer twice the L2's size (most weight matrices
  // fit in an H200's 50 MB L2, where repeated runs would measure L2 bandwidth instead).
  if (flush_ == nullptr) {
    int device = 0, l2_bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    const size_t bytes = std::max<size_t>(2 * static_cast<size_t>(l2_bytes), 8u << 20);
    if (cudaMalloc(&flush_, bytes) != cudaSuccess) {
      cudaGetLastError();  // no room to measure: keep cuBLASLt
      flush_ = nullptr;
      return;
    }
    flush_bytes_ = bytes;
  }
  cudaEvent_t ev[2];
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  constexpr int kReps = 5;
  float total[2] = {0.0f, 0.0f};  // cuBLASLt, GEMV
  Plan candidate[2] = {p, p};
  candidate[0].use_gemv = false;
  candidate[1].use_gemv = true;
  for (int rep = 0; rep <= kReps; ++rep) {  // rep 0 warms both up and is not counted
    for (int c = 0; c < 2; ++c) {
      CUDA_CHECK(cudaMemsetAsync(flush_, rep + c, flush_bytes_, stream_));
      CUDA_CHECK(cudaEventRecord(ev[0], stream_));
      run_plan(candidate[c], x, w, bias, bias_dtype, out);  // same values each time
      CUDA_CHECK(cudaEventRecord(ev[1], stream_));
      CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      if (rep > 0) total[c] += ms;
    }
  }
  for (auto& e : ev) cudaEventDestroy(e);
  p.use_gemv = total[1] < total[0];
}

void Gemm::run_plan(const Plan& p, const RowView& x, const RowView& w, const void* bias,
                    DType bias_dtype, const RowView& out, bool accumulate) {
  if (p.use_gemv) {
    GemvFusion f;
    if (accumulate) f.epilogue = GemvEpilogue::kAdd;
    launch_gemv(x, w, bias, bias_dtype, out, stream_, f);
    return;
  }
  if (p.use_fallback) {
    launch_gemm_fallback(x, w, bias, bias_dtype, out, stream_, accumulate);
    return;
  }
  if (p.bias_in_epilogue)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  // beta = 1 with C = D = out: out = x . w^T + out (+ bias in the epilogue).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w.data, p.a, x.data, p.b, &beta, out.data,
                              p.d, out.data, p.d, &p.algo, workspace_, kWorkspaceBytes, stream_));
  if (bias != nullptr && !p.bias_in_epilogue) launch_add_bias(out, bias, bias_dtype, stream_);
}

void Gemm::run_batched(const RowView& x, int64_t x_batch_stride, const RowView& w,
                       int64_t w_batch_stride, const RowView& out, int64_t out_batch_stride,
                       int64_t batch) {
  if (batch == 0 || x.n_rows == 0 || w.n_rows == 0) return;
  PAGELLM_CHECK_MSG(w.dtype == DType::kBF16 && x.dtype == DType::kBF16,
                    "gemm: batched products take bf16 x and w");
  PAGELLM_CHECK_MSG(batch <= INT32_MAX, "gemm: batch count out of range");
  if (x.n_rows <= 2 && gemv_batched_supported(x, x_batch_stride, w, w_batch_stride, out, batch)) {
    // One or two rows: the GEMV, by the same rule as run() (decode streams the weights).
    launch_gemv_batched(x, x_batch_stride, w, w_batch_stride, out, out_batch_stride, batch,
                        stream_);
    return;
  }
  const int64_t out_bytes = out.dtype == DType::kF32 ? 4 : 2;
  const uint32_t align[4] = {batched_alignment_of(w.data, w_batch_stride, 2),
                             batched_alignment_of(x.data, x_batch_stride, 2),
                             batched_alignment_of(out.data, out_batch_stride, out_bytes), 0u};
  const BatchedKey key{x.n_rows,       x.cols,         w.n_rows,
                       x.ld,           w.ld,           out.ld,
                       static_cast<int>(out.dtype), batch,
                       x_batch_stride, w_batch_stride, out_batch_stride,
                       align[0],       align[1],       align[2]};
  auto it = batched_plans_.find(key);
  const GemmBatch entries{batch, x_batch_stride, w_batch_stride, out_batch_stride};
  if (it != batched_plans_.end()) {
    refine_if_capturing(it->second);
  } else {
    const Shape shape = shape_of(x, w, out, nullptr, DType::kF32, align, entries);
    Plan p;
    if (plan_from_bucket(p, x, w, nullptr, DType::kF32, out, entries, shape)) {
      it = batched_plans_.emplace(key, p).first;
      keep_provisional(it->second, shape);
    } else {
      if (!try_make_plan(p, x, w, nullptr, DType::kF32, out, align, entries))
        p.use_fallback = true;
      else if (x.n_rows > kGemvMaxRows)
        settle_algo(p, shape, x.n_rows);
      it = batched_plans_.emplace(key, p).first;
    }
  }
  const Plan& p = it->second;
  if (p.use_fallback) {
    const auto entry = [](RowView v, int64_t stride, int64_t b, int64_t elem_bytes) {
      v.data = static_cast<char*>(v.data) + b * stride * elem_bytes;
      return v;
    };
    for (int64_t b = 0; b < batch; ++b)
      launch_gemm_fallback(entry(x, x_batch_stride, b, 2), entry(w, w_batch_stride, b, 2), nullptr,
                           DType::kF32, entry(out, out_batch_stride, b, out_bytes), stream_);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w.data, p.a, x.data, p.b, &beta, out.data,
                              p.d, out.data, p.d, &p.algo, workspace_, kWorkspaceBytes, stream_));
}

Gemm::Plan& Gemm::chosen_plan(const RowView& x, const RowView& w, const void* bias,
                              DType bias_dtype, const RowView& out, const RowView* timing_out) {
  const size_t n_plans_before = plans_.size();
  Plan& p = plan_for(x, w, bias, bias_dtype, out);
  if (plans_.size() != n_plans_before && gemv_supported(x, w, out)) {
    // One or two rows: the GEMV, by rule rather than by timing, so that batch-1 decode runs the
    // same kernels (and rounds the same way) in every process. On the H200 it streamed the
    // Llama-3-8B decode matrices at 90-100% of bandwidth where cuBLASLt reached 49-93%
    // (docs/PERF.md).
    if (x.n_rows <= 2) {
      p.use_gemv = true;
    } else if (timing_out != nullptr) {
      choose_gemv(p, x, w, bias, bias_dtype, *timing_out);
    }
  }
  return p;
}

void Gemm::run(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
               const RowView& out) {
  if (x.n_rows == 0 || w.n_rows == 0) return;
  run_plan(chosen_plan(x, w, bias, bias_dtype, out, &out), x, w, bias, bias_dtype, out);
}

void Gemm::run_add(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                   const RowView& out, const RowView& scratch) {
  if (x.n_rows == 0 || w.n_rows == 0) return;
  PAGELLM_CHECK_MSG(
      scratch.n_rows == out.n_rows && scratch.cols == out.cols && scratch.dtype == out.dtype,
      "gemm: the add's scratch is not out's shape");
  // The plan is made for out's strides and alignment, so the timing runs need a scratch that
  // keeps them; one that does not leaves the shape on cuBLASLt (as during a recording).
  const bool can_time =
      scratch.ld == out.ld && alignment_of(scratch.data) >= alignment_of(out.data);
  run_plan(chosen_plan(x, w, bias, bias_dtype, out, can_time ? &scratch : nullptr), x, w, bias,
           bias_dtype, out, /*accumulate=*/true);
}

bool Gemm::uses_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                     const RowView& out) {
  if (x.n_rows == 0 || w.n_rows == 0) return false;
  return chosen_plan(x, w, bias, bias_dtype, out, &out).use_gemv;
}

}  // namespace pagellm::cuda
