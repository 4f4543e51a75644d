// CudaBackend's 4-bit weights (int4_gemm.cu has the layout and kernels): which host types stay
// 4-bit on the device, their upload and random fill, and the products: the 4-bit GEMV up to
// kInt4GemvMaxRows rows of x, and past that the weight dequantized a slice of rows at a time into
// a bf16 scratch small enough to stay in L2, each slice multiplied by cuBLASLt (Gemm) into its
// columns of the output, so the bf16 copy of the weight never goes out to memory.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_views.h"

namespace pagellm::cuda {

DType CudaBackend::quantized_storage(DType host, int64_t rows, int64_t cols) const {
  const DType kept = int4_device_type(host);
  return int4_layout_fits(kept, rows, cols) ? kept : DType::kF32;
}

Result<Tensor> CudaBackend::upload_int4(const Tensor& host, DType dtype,
                                        std::unique_ptr<Buffer>& storage) {
  const int64_t rows = host.rows(), cols = host.cols();
  if (int4_device_type(host.dtype) != dtype || !int4_layout_fits(dtype, rows, cols))
    return invalid_argument("upload_weight: a " + std::string(dtype_name(host.dtype)) + " tensor " +
                            host.shape_string() + " cannot be kept as " +
                            std::string(dtype_name(dtype)) +
                            " (the device's 4-bit layout takes whole 16-row stripes and 64-column "
                            "chunks)");
  PAGELLM_ASSIGN_OR_RETURN(storage, allocate_or_error(dtype_bytes(dtype, host.numel()),
                                                      "a weight " + host.shape_string()));
  ensure_int4_slices();
  Tensor dev = host;
  dev.data = storage->data();
  dev.dtype = dtype;
  dev.device = Device::kCuda;
  dev.set_contiguous_strides();
  // Whole stripes of host blocks through the staging buffer, repacked on the device.
  const int64_t src_stripe = dtype_bytes(host.dtype, 16 * cols);
  const int64_t stripes = std::max<int64_t>(1, kUploadChunkBytes / src_stripe);
  void* staging = ensure_upload_staging(std::min(rows / 16, stripes) * src_stripe);
  const char* src = static_cast<const char*>(host.data);
  char* dst = static_cast<char*>(dev.data);
  for (int64_t r0 = 0; r0 < rows; r0 += 16 * stripes) {
    const int64_t nr = std::min(16 * stripes, rows - r0);
    CUDA_CHECK(cudaMemcpyAsync(staging, src + dtype_bytes(host.dtype, r0 * cols),
                               dtype_bytes(host.dtype, nr * cols), cudaMemcpyHostToDevice,
                               stream_));
    launch_int4_repack(staging, host.dtype, dst + dtype_bytes(dtype, r0 * cols), dtype, nr, cols,
                       stream_);
  }
  return dev;
}

void CudaBackend::fill_random_int4(Tensor& t, uint64_t seed, float lo, float hi) {
  const int64_t rows = t.rows(), cols = t.cols();
  PAGELLM_CHECK_MSG(int4_layout_fits(t.dtype, rows, cols),
                    "fill_random: a 4-bit tensor must fit the device layout");
  ensure_int4_slices();
  // In pieces of whole stripes through the staging buffer; the blocks' random bytes are indexed
  // from the tensor's start, as the CPU backend's are.
  const int64_t stripe = dtype_bytes(t.dtype, 16 * cols);
  const int64_t stripes = std::max<int64_t>(1, kUploadChunkBytes / stripe);
  void* staging = ensure_upload_staging(std::min(rows / 16, stripes) * stripe);
  for (int64_t r0 = 0; r0 < rows; r0 += 16 * stripes) {
    const int64_t nr = std::min(16 * stripes, rows - r0);
    launch_int4_random(static_cast<char*>(t.data) + dtype_bytes(t.dtype, r0 * cols), t.dtype, nr,
                       cols, r0 * cols / int4_group(t.dtype), staging, seed, lo, hi, stream_);
  }
}

void CudaBackend::ensure_int4_slices() {
  // Made with the first 4-bit weight, before any step: a recording cannot allocate.
  if (int4_slice_ == nullptr) int4_slice_ = must_allocate(kInt4SliceBytes, "the 4-bit GEMM slice");
  if (side_int4_slice_ == nullptr)
    side_int4_slice_ = must_allocate(kInt4SliceBytes, "the side branch's 4-bit GEMM slice");
}

void CudaBackend::int4_matmul(const MatmulOperands& m, const Tensor* add_scratch) {
  const bool accumulate = add_scratch != nullptr;
  if (int4_gemv_supported(m.x, m.w, m.out)) {
    launch_int4_gemv(m.x, m.w, m.bias, m.bias_dtype, m.out, accumulate, stream_);
    return;
  }
  PAGELLM_CHECK_MSG(int4_layout_fits(m.w.dtype, m.w.n_rows, m.w.cols),
                    "matmul: a 4-bit weight not in the device layout");
  // Slices of equal whole stripes, each at most kInt4SliceBytes of bf16.
  const int64_t M = m.w.n_rows, K = m.w.cols;
  const int64_t most = std::max<int64_t>(16, kInt4SliceBytes / (2 * K) / 16 * 16);
  const int64_t n_slices = (M + most - 1) / most;
  const int64_t per = ((M + n_slices - 1) / n_slices + 15) / 16 * 16;
  const int64_t out_esz = dtype_bytes(m.out.dtype, 1);
  const int64_t bias_esz = m.bias != nullptr ? dtype_bytes(m.bias_dtype, 1) : 0;
  for (int64_t r0 = 0; r0 < M; r0 += per) {
    const int64_t rows = std::min(per, M - r0);
    launch_int4_dequantize(m.w.data, m.w.dtype, r0, rows, K, int4_slice_->data(), stream_);
    const RowView w{int4_slice_->data(), DType::kBF16, rows, K, K};
    const RowView out{static_cast<char*>(m.out.data) + r0 * out_esz, m.out.dtype, m.out.n_rows,
                      rows, m.out.ld};
    const void* bias =
        m.bias != nullptr ? static_cast<const char*>(m.bias) + r0 * bias_esz : nullptr;
    if (accumulate) {
      const RowView s = rows_of(add_scratch->slice_cols(r0, r0 + rows));
      gemm_->run_add(m.x, w, bias, m.bias_dtype, out, s);
    } else {
      gemm_->run(m.x, w, bias, m.bias_dtype, out);
    }
  }
}

}  // namespace pagellm::cuda
