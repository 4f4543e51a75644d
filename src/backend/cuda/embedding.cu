// Token embedding: a gather of table rows, converted to the activation type on the fly. Launched
// overlapped with the kernel before (device_utils.cuh), for which it waits in pdl_wait() before
// touching memory. A step planned before its input tokens reached the host finds them in the
// sampler's hand-over area here (kernels.h), so it needs no kernel of its own to take them.
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

// Token i's id: negative ids are rows of the last sampling call (kernels.h).
__device__ __forceinline__ int32_t token_id(const int32_t* __restrict__ ids,
                                            const int32_t* __restrict__ handover, int64_t i) {
  const int32_t id = ids[i];
  if (id >= 0 || handover == nullptr) return id;
  const int64_t row = -(int64_t{id} + 1);
  return row < handover[0] ? handover[1 + row] : 0;
}

// One block per token; threads stride over the row. Table rows are contiguous, so consecutive
// threads read consecutive elements.
template <typename TIn, typename TOut>
__global__ void embedding_kernel(const TIn* __restrict__ table, int64_t table_ld, int64_t vocab,
                                 const int32_t* __restrict__ ids,
                                 const int32_t* __restrict__ handover, TOut* __restrict__ out,
                                 int64_t out_ld, int64_t d) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t i = blockIdx.x;
  const int32_t id = token_id(ids, handover, i);
  TOut* o = out + i * out_ld;
  if (id < 0 || id >= vocab) {
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_float<TOut>(0.0f);
    return;
  }
  const TIn* row = table + static_cast<int64_t>(id) * table_ld;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_float<TOut>(to_float(row[c]));
}

// The same for a 2-byte table of the activation type with 16-byte aligned rows: a copy, 16
// bytes a thread, every load of a thread issued before its stores (at batch 1 the kernel is one
// memory round trip on the step's chain, not several).
constexpr int kCopyUnroll = 4;
__global__ void embedding_copy_kernel(const uint4* __restrict__ table, int64_t table_ld16,
                                      int64_t vocab, const int32_t* __restrict__ ids,
                                      const int32_t* __restrict__ handover, uint4* __restrict__ out,
                                      int64_t out_ld16, int64_t d16) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t i = blockIdx.x;
  const int32_t id = token_id(ids, handover, i);
  uint4* o = out + i * out_ld16;
  const bool valid = id >= 0 && id < vocab;
  const uint4* row = table + (valid ? static_cast<int64_t>(id) : 0) * table_ld16;
  for (int64_t c0 = threadIdx.x; c0 < d16; c0 += int64_t{blockDim.x} * kCopyUnroll) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t c = c0 + u * int64_t{blockDim.x};
      v[u] = valid && c < d16 ? row[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t c = c0 + u * int64_t{blockDim.x};
      if (c < d16) o[c] = v[u];
    }
  }
}

}  // namespace

void launch_embedding(const RowView& table, const int32_t* ids, const int32_t* handover,
                      const RowView& out, cudaStream_t stream) {
  if (out.n_rows == 0) return;
  if (table.dtype == out.dtype && dtype_bytes(out.dtype, 1) == 2 && out.cols % 8 == 0 &&
      rows_aligned16(table) && rows_aligned16(out)) {
    launch_overlapped(embedding_copy_kernel, static_cast<unsigned>(out.n_rows), dim3(256), 0,
                      stream, static_cast<const uint4*>(table.data), table.ld / 8, table.n_rows,
                      ids, handover, static_cast<uint4*>(out.data), out.ld / 8, out.cols / 8);
    CUDA_CHECK_LAUNCH();
    return;
  }
  dispatch_float_type(table.dtype, [&](auto tin) {
    using TIn = decltype(tin);
    dispatch_float_type(out.dtype, [&](auto tout) {
      using TOut = decltype(tout);
      launch_overlapped(embedding_kernel<TIn, TOut>, static_cast<unsigned>(out.n_rows), dim3(256),
                        0, stream, static_cast<const TIn*>(table.data), table.ld, table.n_rows, ids,
                        handover, static_cast<TOut*>(out.data), out.ld, out.cols);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace pagellm::cuda
