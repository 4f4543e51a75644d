// Token embedding: a gather of table rows, converted to the activation type on the fly. Launched
// overlapped with the kernel before (device_utils.cuh), for which it waits in pdl_wait() before
// touching memory.
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

// One block per token; threads stride over the row. Table rows are contiguous, so consecutive
// threads read consecutive elements.
template <typename TIn, typename TOut>
__global__ void embedding_kernel(const TIn* __restrict__ table, int64_t table_ld, int64_t vocab,
                                 const int32_t* __restrict__ ids, TOut* __restrict__ out,
                                 int64_t out_ld, int64_t d) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  TOut* o = out + i * out_ld;
  if (id < 0 || id >= vocab) {
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_float<TOut>(0.0f);
    return;
  }
  const TIn* row = table + static_cast<int64_t>(id) * table_ld;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_float<TOut>(to_float(row[c]));
}

}  // namespace

void launch_embedding(const RowView& table, const int32_t* ids, const RowView& out,
                      cudaStream_t stream) {
  if (out.n_rows == 0) return;
  dispatch_float_type(table.dtype, [&](auto tin) {
    using TIn = decltype(tin);
    dispatch_float_type(out.dtype, [&](auto tout) {
      using TOut = decltype(tout);
      launch_overlapped(embedding_kernel<TIn, TOut>, static_cast<unsigned>(out.n_rows), dim3(256),
                        0, stream, static_cast<const TIn*>(table.data), table.ld, table.n_rows, ids,
                        static_cast<TOut*>(out.data), out.ld, out.cols);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace pagellm::cuda
