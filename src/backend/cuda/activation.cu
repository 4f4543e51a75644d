// Elementwise ops over row views: SwiGLU's silu(gate) * up, add, conversion to f32 for logits,
// row gather, and the bias add used when the GEMM epilogue cannot take the bias. All are steps of a
// forward pass, launched overlapped with the kernel before (device_utils.cuh): each waits for it in
// pdl_wait() before touching memory.
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;

// Grid: x over column tiles of kThreads, y over rows (grid-strided past 65535 rows).
dim3 row_grid(int64_t n_rows, int64_t cols) {
  return dim3(ceil_div(cols, kThreads), static_cast<unsigned>(std::min<int64_t>(n_rows, 65535)));
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate, int64_t ldg, const T* up, int64_t ldu, T* out,
                                int64_t ldo, int64_t n_rows, int64_t cols) {
  pdl_wait();        // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();  // the down projection's GEMV may start fetching its weights
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    const float g = to_float(gate[r * ldg + c]);
    const float u = to_float(up[r * ldu + c]);
    // silu(g) = g / (1 + e^-g); expf of a large positive -g gives inf and g / inf = -0, the limit.
    out[r * ldo + c] = from_float<T>(g / (1.0f + expf(-g)) * u);
  }
}

// The bf16 rows of every model, 8 elements (16 bytes) per thread: one vector load per operand
// instead of eight, which is what the scalar kernel above is bound by on wide rows.
__global__ void silu_mul_bf16x8_kernel(const bf16* gate, int64_t ldg, const bf16* up, int64_t ldu,
                                       bf16* out, int64_t ldo, int64_t n_rows, int64_t cols) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    float g[8], u[8];
    unpack_bf16x8(*reinterpret_cast<const uint4*>(gate + r * ldg + c), g);
    unpack_bf16x8(*reinterpret_cast<const uint4*>(up + r * ldu + c), u);
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    *reinterpret_cast<uint4*>(out + r * ldo + c) = pack_bf16x8(g);
  }
}

template <typename T>
__global__ void add_kernel(const T* a, int64_t lda, const T* b, int64_t ldb, T* out, int64_t ldo,
                           int64_t n_rows, int64_t cols) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y)
    out[r * ldo + c] = from_float<T>(to_float(a[r * lda + c]) + to_float(b[r * ldb + c]));
}

template <typename T>
__global__ void to_f32_kernel(const T* __restrict__ x, int64_t ldx, float* __restrict__ out,
                              int64_t ldo, int64_t n_rows, int64_t cols) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) out[r * ldo + c] = to_float(x[r * ldx + c]);
}

template <typename T>
__global__ void gather_rows_kernel(const T* __restrict__ x, int64_t ldx, int64_t x_rows,
                                   const int32_t* __restrict__ rows, T* __restrict__ out,
                                   int64_t ldo, int64_t n_rows, int64_t cols) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    const int32_t src = rows[r];
    // Indices are planned by the engine; an out-of-range one yields zeros rather than a wild read.
    out[r * ldo + c] = (src >= 0 && src < x_rows) ? x[src * ldx + c] : from_float<T>(0.0f);
  }
}

template <typename T, typename TB>
__global__ void add_bias_kernel(T* out, int64_t ldo, const TB* __restrict__ bias, int64_t n_rows,
                                int64_t cols) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = to_float(bias[c]);
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y)
    out[r * ldo + c] = from_float<T>(to_float(out[r * ldo + c]) + b);
}

}  // namespace

void launch_silu_mul(const RowView& gate, const RowView& up, const RowView& out,
                     cudaStream_t stream) {
  if (out.n_rows == 0 || out.cols == 0) return;
  if (out.dtype == DType::kBF16 && out.cols % 8 == 0 && rows_aligned16(gate) &&
      rows_aligned16(up) && rows_aligned16(out)) {
    launch_overlapped(silu_mul_bf16x8_kernel, row_grid(out.n_rows, out.cols / 8), dim3(kThreads), 0,
                      stream, static_cast<const bf16*>(gate.data), gate.ld,
                      static_cast<const bf16*>(up.data), up.ld, static_cast<bf16*>(out.data),
                      out.ld, out.n_rows, out.cols);
    CUDA_CHECK_LAUNCH();
    return;
  }
  dispatch_float_type(out.dtype, [&](auto t) {
    using T = decltype(t);
    launch_overlapped(silu_mul_kernel<T>, row_grid(out.n_rows, out.cols), dim3(kThreads), 0, stream,
                      static_cast<const T*>(gate.data), gate.ld, static_cast<const T*>(up.data),
                      up.ld, static_cast<T*>(out.data), out.ld, out.n_rows, out.cols);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_add(const RowView& a, const RowView& b, const RowView& out, cudaStream_t stream) {
  if (out.n_rows == 0 || out.cols == 0) return;
  dispatch_float_type(out.dtype, [&](auto t) {
    using T = decltype(t);
    launch_overlapped(add_kernel<T>, row_grid(out.n_rows, out.cols), dim3(kThreads), 0, stream,
                      static_cast<const T*>(a.data), a.ld, static_cast<const T*>(b.data), b.ld,
                      static_cast<T*>(out.data), out.ld, out.n_rows, out.cols);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_to_f32(const RowView& x, const RowView& out, cudaStream_t stream) {
  if (out.n_rows == 0 || out.cols == 0) return;
  dispatch_float_type(x.dtype, [&](auto t) {
    using T = decltype(t);
    launch_overlapped(to_f32_kernel<T>, row_grid(out.n_rows, out.cols), dim3(kThreads), 0, stream,
                      static_cast<const T*>(x.data), x.ld, static_cast<float*>(out.data), out.ld,
                      out.n_rows, out.cols);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_gather_rows(const RowView& x, const int32_t* rows, const RowView& out,
                        cudaStream_t stream) {
  if (out.n_rows == 0 || out.cols == 0) return;
  dispatch_float_type(x.dtype, [&](auto t) {
    using T = decltype(t);
    launch_overlapped(gather_rows_kernel<T>, row_grid(out.n_rows, out.cols), dim3(kThreads), 0,
                      stream, static_cast<const T*>(x.data), x.ld, x.n_rows, rows,
                      static_cast<T*>(out.data), out.ld, out.n_rows, out.cols);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_add_bias(const RowView& out, const void* bias, DType bias_dtype, cudaStream_t stream) {
  if (out.n_rows == 0 || out.cols == 0) return;
  dispatch_float_type(out.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_float_type(bias_dtype, [&](auto tb) {
      using TB = decltype(tb);
      launch_overlapped(add_bias_kernel<T, TB>, row_grid(out.n_rows, out.cols), dim3(kThreads), 0,
                        stream, static_cast<T*>(out.data), out.ld, static_cast<const TB*>(bias),
                        out.n_rows, out.cols);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace pagellm::cuda
