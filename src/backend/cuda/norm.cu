// RMSNorm and the fused residual add + RMSNorm. One block per row, fp32 accumulation of the sum of
// squares. The math follows the reference (Hugging Face's LlamaRMSNorm in f32):
// out = (x * rsqrt(mean(x^2) + eps)) * w, rounded once to the output type. Launched overlapped with
// the kernel before (device_utils.cuh): each waits for it in pdl_wait() before touching memory.
// Also the load-time fold of a norm weight into the columns of the projection after it.
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

// Threads own the elements c = threadIdx.x + k * blockDim.x in both passes, so writing `out` over
// `x` (aliasing) is safe: each element is read and written by the same thread, read first.
template <typename T, typename TW>
__global__ void rms_norm_kernel(const T* x, int64_t ldx, const TW* __restrict__ w, float eps,
                                T* out, int64_t ldo, int64_t d, bool release) {
  __shared__ float scratch[32];
  // First: the kernel before may still be running (launch_overlapped). The kernel after (a GEMV
  // reading this output starts fetching its weights) may launch once this one waits, or with
  // `release` at once (launch_rms_norm).
  pdl_wait_and_release(release);
  const int64_t r = blockIdx.x;
  const T* xr = x + r * ldx;
  T* orow = out + r * ldo;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float v = to_float(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    orow[c] = from_float<T>((to_float(xr[c]) * inv) * to_float(w[c]));
}

// Each thread keeps its elements of the row in registers (kNormPer of them at most: rows up to
// kNormPer * 1024 wide) and loads its weights before the block-wide reduction, so the row is read
// once and the weights' latency hides behind the reduction. Wider rows take the loop below.
constexpr int kNormPer = 8;

template <typename T, typename TW>
__global__ void add_rms_norm_kernel(const T* x, int64_t ldx, T* res, int64_t ldr,
                                    const TW* __restrict__ w, float eps, T* out, int64_t ldo,
                                    int64_t d, bool release) {
  __shared__ float scratch[32];
  // First: the kernel before may still be running (launch_overlapped). The kernel after (a GEMV
  // reading this output starts fetching its weights) may launch once this one waits, or with
  // `release` at once (launch_rms_norm).
  pdl_wait_and_release(release);
  const int64_t r = blockIdx.x;
  const T* xr = x + r * ldx;
  T* rr = res + r * ldr;
  T* orow = out + r * ldo;
  if (d <= kNormPer * static_cast<int64_t>(blockDim.x)) {
    float v[kNormPer], wv[kNormPer];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t c = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
      v[k] = 0.0f;
      wv[k] = 0.0f;
      if (c < d) {
        // The sum is rounded to the residual's type first and the norm is taken of the stored
        // value, so `out` is exactly rms_norm(residual) of what the next layer will add to.
        const T sum = from_float<T>(to_float(rr[c]) + to_float(xr[c]));
        rr[c] = sum;
        v[k] = to_float(sum);
        wv[k] = to_float(w[c]);
        ss += v[k] * v[k];
      }
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t c = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
      if (c < d) orow[c] = from_float<T>((v[k] * inv) * wv[k]);
    }
    return;
  }
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const T sum = from_float<T>(to_float(rr[c]) + to_float(xr[c]));
    rr[c] = sum;
    const float v = to_float(sum);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    orow[c] = from_float<T>((to_float(rr[c]) * inv) * to_float(w[c]));
}

// The common case of both kernels above, 16 bytes at a time: bf16 rows up to 8 * 1024 wide on
// 16-byte boundaries, each thread holding 8 contiguous elements (one vector load of x and of the
// residual, one store of each result) instead of 8 scattered 2-byte accesses, its weights loaded
// before the block-wide reduction. kAdd: the fused residual add (res is ignored without it). out
// may alias x: each thread reads its elements before anyone writes.
template <typename TW, bool kAdd>
__global__ void rms_norm_bf16x8_kernel(const bf16* x, int64_t ldx, bf16* res, int64_t ldr,
                                       const TW* __restrict__ w, float eps, bf16* out, int64_t ldo,
                                       int64_t d, bool release) {
  __shared__ float scratch[32];
  // First: the kernel before may still be running (launch_overlapped). The kernel after (a GEMV
  // reading this output starts fetching its weights) may launch once this one waits, or with
  // `release` at once (launch_rms_norm).
  pdl_wait_and_release(release);
  const int64_t r = blockIdx.x, c = threadIdx.x * 8;
  const bool mine = c < d;
  float v[8], wv[8];
  float ss = 0.0f;
  if (mine) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(x + r * ldx + c), v);
    if constexpr (kAdd) {
      float rv[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(res + r * ldr + c), rv);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = rv[i] + v[i];
      // The sum is rounded to the residual's type first and the norm is taken of the stored
      // value, as in add_rms_norm_kernel.
      const uint4 sv = pack_bf16x8(v);
      *reinterpret_cast<uint4*>(res + r * ldr + c) = sv;
      unpack_bf16x8(sv, v);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[i] = to_float(w[c + i]);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  if (mine) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (v[i] * inv) * wv[i];
    *reinterpret_cast<uint4*>(out + r * ldo + c) = pack_bf16x8(v);
  }
}

bool bf16x8_rows(const RowView& v) {
  return v.dtype == DType::kBF16 && v.cols % 8 == 0 && v.cols <= 8 * 1024 && rows_aligned16(v);
}

// 128 threads for short rows (per-head q/k norms of 64..256), up to 1024 for wide hidden states.
int norm_threads(int64_t d) {
  int t = 128;
  while (t < 1024 && t * 4 < d) t *= 2;
  return t;
}

// The fused add + norm: enough threads that each holds at most kNormPer elements (fewer threads
// make the block reduction cheaper), at least 128.
int add_norm_threads(int64_t d) {
  int t = 128;
  while (t < 1024 && t * kNormPer < d) t *= 2;
  return t;
}

// A load-time pass (once per folded matrix): one element per thread and step, no vector loads.
__global__ void scale_columns_kernel(bf16* w, int64_t ld, int64_t rows, int64_t cols,
                                     const float* __restrict__ g) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    bf16& v = w[r * ld + c];
    v = from_float<bf16>(to_float(v) * g[c]);
  }
}

}  // namespace

// Threads of the 16-byte kernel for rows of d elements: 8 elements each, whole warps.
int bf16x8_threads(int64_t d) {
  return static_cast<int>((d / 8 + 31) / 32 * 32);
}

void launch_rms_norm(const RowView& x, const void* w, DType w_dtype, float eps, const RowView& out,
                     cudaStream_t stream, bool release_early) {
  if (x.n_rows == 0) return;
  if (bf16x8_rows(x) && bf16x8_rows(out)) {
    dispatch_float_type(w_dtype, [&](auto tw) {
      using TW = decltype(tw);
      launch_overlapped(rms_norm_bf16x8_kernel<TW, false>, static_cast<unsigned>(x.n_rows),
                        bf16x8_threads(x.cols), 0, stream, static_cast<const bf16*>(x.data), x.ld,
                        static_cast<bf16*>(nullptr), int64_t{0}, static_cast<const TW*>(w), eps,
                        static_cast<bf16*>(out.data), out.ld, x.cols, release_early);
      CUDA_CHECK_LAUNCH();
    });
    return;
  }
  dispatch_float_type(x.dtype, [&](auto tx) {
    using T = decltype(tx);
    dispatch_float_type(w_dtype, [&](auto tw) {
      using TW = decltype(tw);
      launch_overlapped(rms_norm_kernel<T, TW>, static_cast<unsigned>(x.n_rows),
                        norm_threads(x.cols), 0, stream, static_cast<const T*>(x.data), x.ld,
                        static_cast<const TW*>(w), eps, static_cast<T*>(out.data), out.ld, x.cols,
                        release_early);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_add_rms_norm(const RowView& x, const RowView& residual, const void* w, DType w_dtype,
                         float eps, const RowView& out, cudaStream_t stream, bool release_early) {
  if (x.n_rows == 0) return;
  if (bf16x8_rows(x) && bf16x8_rows(residual) && bf16x8_rows(out)) {
    dispatch_float_type(w_dtype, [&](auto tw) {
      using TW = decltype(tw);
      launch_overlapped(rms_norm_bf16x8_kernel<TW, true>, static_cast<unsigned>(x.n_rows),
                        bf16x8_threads(x.cols), 0, stream, static_cast<const bf16*>(x.data), x.ld,
                        static_cast<bf16*>(residual.data), residual.ld, static_cast<const TW*>(w),
                        eps, static_cast<bf16*>(out.data), out.ld, x.cols, release_early);
      CUDA_CHECK_LAUNCH();
    });
    return;
  }
  dispatch_float_type(x.dtype, [&](auto tx) {
    using T = decltype(tx);
    dispatch_float_type(w_dtype, [&](auto tw) {
      using TW = decltype(tw);
      launch_overlapped(add_rms_norm_kernel<T, TW>, static_cast<unsigned>(x.n_rows),
                        add_norm_threads(x.cols), 0, stream, static_cast<const T*>(x.data), x.ld,
                        static_cast<T*>(residual.data), residual.ld, static_cast<const TW*>(w), eps,
                        static_cast<T*>(out.data), out.ld, x.cols, release_early);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_scale_columns(const RowView& w, const float* g, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(w.dtype == DType::kBF16, "scale_columns: w must be bf16");
  if (w.n_rows == 0 || w.cols == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(w.n_rows * w.cols, kThreads), 65536);
  scale_columns_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<bf16*>(w.data), w.ld, w.n_rows, w.cols, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
