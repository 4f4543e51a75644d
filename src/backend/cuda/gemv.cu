// Matrix-vector products for decode: out[n, M] = x[n, K] . w[M, K]^T (+ bias) with n <= 8 and bf16
// weights. At these sizes the product is a stream over the weights, so the kernel is built to keep
// as many weight bytes in flight as the memory system needs: each warp owns kGemvRows output rows,
// each lane reads 16-byte pieces of them (a warp covers 512 contiguous bytes of a row per load) and
// issues kGemvUnroll such loads per row before using any; x (n rows, a few to a few hundred KB)
// is read through L1 and reused for every row of the warp. Accumulation is fp32, reduced across the
// warp at the end. Gemm (gemm.h) picks it over cuBLASLt per shape when it measures faster. A batch
// of independent products of one shape (per-head projections) runs as one launch, an entry per
// blockIdx.y. Launched overlapped with the kernel before it (device_utils.cuh), it prefetches the
// start of its weight rows while that kernel finishes.
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRows = 2;    // output rows per warp
constexpr int kGemvUnroll = 4;  // 16-byte loads per row a lane issues before the math
constexpr int64_t kGemvPrefetch = 512;  // elements per row pulled into L2 before the wait (1 KB:
                                        // ~17 MB over all resident blocks, a few us of DRAM time)

__device__ __forceinline__ float bias_at(const void* bias, DType t, int64_t m) {
  if (bias == nullptr) return 0.0f;
  switch (t) {
    case DType::kBF16: return to_float(static_cast<const bf16*>(bias)[m]);
    case DType::kF16: return to_float(static_cast<const __half*>(bias)[m]);
    default: return static_cast<const float*>(bias)[m];
  }
}

template <int N, typename TOut>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t ldw,
                const void* __restrict__ bias, DType bias_dtype, TOut* __restrict__ out,
                int64_t ldo, int64_t m_dim, int64_t k_dim, int64_t x_batch_stride,
                int64_t w_batch_stride, int64_t out_batch_stride) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x += blockIdx.y * x_batch_stride;  // batch entry (0 for a single product)
  w += blockIdx.y * w_batch_stride;
  out += blockIdx.y * out_batch_stride;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kGemvRows;
  if (m0 >= m_dim) return;
  float acc[kGemvRows][N];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] = 0.0f;
  const bf16* wr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) wr[r] = w + min(m0 + r, m_dim - 1) * ldw;  // tail: re-read the last row
    // The weights do not depend on the kernel before this one: start pulling the first
    // kGemvPrefetch elements of each row into L2 while it finishes (launch_overlapped), then wait
    // for it before touching x. Enough to keep DRAM busy across the hand-over, too little to push
    // the rows of the first blocks out of L2 before they are read.
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    const int64_t k = lane * 64;  // one 128-byte line per lane
    if (k < k_dim && k < kGemvPrefetch) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + k));
  }
  pdl_wait();

  constexpr int64_t kStep = 32 * 8;  // elements a warp covers per load
  for (int64_t k0 = lane * 8; k0 < k_dim; k0 += kStep * kGemvUnroll) {
    uint4 wv[kGemvUnroll][kGemvRows];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
        wv[u][r] = k < k_dim ? load_stream(wr[r] + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k >= k_dim) break;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + j * ldx + k));
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) acc[r][j] += dot8(wv[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] = warp_sum(acc[r][j]);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const int64_t m = m0 + r;
      if (m >= m_dim) break;
      const float b = bias_at(bias, bias_dtype, m);
#pragma unroll
      for (int j = 0; j < N; ++j) out[j * ldo + m] = from_float<TOut>(acc[r][j] + b);
    }
  }
}

template <int N>
void launch_n(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
              const RowView& out, int64_t batch, int64_t x_bs, int64_t w_bs, int64_t o_bs,
              cudaStream_t stream) {
  const dim3 grid(ceil_div(w.n_rows, kGemvWarps * kGemvRows), static_cast<unsigned>(batch));
  const auto* xp = static_cast<const bf16*>(x.data);
  const auto* wp = static_cast<const bf16*>(w.data);
  if (out.dtype == DType::kF32) {
    launch_overlapped(gemv_kernel<N, float>, grid, dim3(kGemvThreads), 0, stream, xp, x.ld, wp,
                      w.ld, bias, bias_dtype, static_cast<float*>(out.data), out.ld, w.n_rows,
                      x.cols, x_bs, w_bs, o_bs);
  } else {
    launch_overlapped(gemv_kernel<N, bf16>, grid, dim3(kGemvThreads), 0, stream, xp, x.ld, wp, w.ld,
                      bias, bias_dtype, static_cast<bf16*>(out.data), out.ld, w.n_rows, x.cols,
                      x_bs, w_bs, o_bs);
  }
}

}  // namespace

bool gemv_supported(const RowView& x, const RowView& w, const RowView& out) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return x.n_rows >= 1 && x.n_rows <= kGemvMaxRows && w.dtype == DType::kBF16 &&
         x.dtype == DType::kBF16 && (out.dtype == DType::kBF16 || out.dtype == DType::kF32) &&
         x.cols % 8 == 0 && x.ld % 8 == 0 && w.ld % 8 == 0 && aligned16(x.data) &&
         aligned16(w.data) && w.n_rows > 0;
}

namespace {

void launch_rows(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out, int64_t batch, int64_t x_bs, int64_t w_bs, int64_t o_bs,
                 cudaStream_t stream) {
  switch (x.n_rows) {
    case 1: launch_n<1>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 2: launch_n<2>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 3: launch_n<3>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 4: launch_n<4>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 5: launch_n<5>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 6: launch_n<6>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    case 7: launch_n<7>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
    default: launch_n<8>(x, w, bias, bias_dtype, out, batch, x_bs, w_bs, o_bs, stream); break;
  }
}

}  // namespace

void launch_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(gemv_supported(x, w, out), "gemv: unsupported shape, type or alignment");
  launch_rows(x, w, bias, bias_dtype, out, 1, 0, 0, 0, stream);
}

bool gemv_batched_supported(const RowView& x, int64_t x_batch_stride, const RowView& w,
                            int64_t w_batch_stride, const RowView& out, int64_t batch) {
  return gemv_supported(x, w, out) && batch >= 1 && batch <= 65535 && x_batch_stride >= 0 &&
         w_batch_stride >= 0 && x_batch_stride % 8 == 0 && w_batch_stride % 8 == 0;
}

void launch_gemv_batched(const RowView& x, int64_t x_batch_stride, const RowView& w,
                         int64_t w_batch_stride, const RowView& out, int64_t out_batch_stride,
                         int64_t batch, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(gemv_batched_supported(x, x_batch_stride, w, w_batch_stride, out, batch),
                    "gemv: unsupported batched shape, type or alignment");
  launch_rows(x, w, nullptr, DType::kF32, out, batch, x_batch_stride, w_batch_stride,
              out_batch_stride, stream);
}

}  // namespace pagellm::cuda
