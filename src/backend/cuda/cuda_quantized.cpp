// CudaBackend's weights kept quantized on the device: the 4-bit group types (int4_gemm.cu) and
// FP8 (fp8_gemm.cu, as F8G128 or F8Row). Which host types stay quantized, their upload and random
// fill, and the products: the format's GEMV up to its row limit; past that, FP8 weights on FP8
// tensor cores (Fp8Matmul), and the others (FP8 too where the device has no FP8 tensor cores)
// dequantized a slice of rows at a time into a bf16 scratch small enough to stay in L2, each slice
// multiplied by cuBLASLt (Gemm) into its columns of the output, so the bf16 copy of the weight
// never goes out to memory.
#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_matmul.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_views.h"
#include "core/log.h"

namespace pagellm::cuda {
namespace {

// n_rows rows of host blocks (a kept type's host format) -> rows [first_row, first_row + n_rows)
// of the kept weight of total_rows rows at w.
void repack(const void* src, DType src_dtype, void* w, DType kept, int64_t total_rows,
            int64_t first_row, int64_t n_rows, int64_t cols, cudaStream_t stream) {
  if (is_kept_fp8(kept)) {
    launch_fp8_repack(src, src_dtype, w, total_rows, first_row, n_rows, cols, stream);
  } else {  // 4-bit stripes are self-contained
    launch_int4_repack(src, src_dtype, static_cast<char*>(w) + dtype_bytes(kept, first_row * cols),
                       kept, n_rows, cols, stream);
  }
}

// Rows [first_row, first_row + n_rows) of a kept weight of total_rows rows -> bf16 row-major at
// out.
void dequantize_rows(const void* w, DType kept, int64_t total_rows, int64_t first_row,
                     int64_t n_rows, int64_t cols, void* out, cudaStream_t stream) {
  if (is_kept_fp8(kept)) {
    launch_fp8_dequantize(w, total_rows, first_row, n_rows, cols, out, stream);
  } else {
    launch_int4_dequantize(w, kept, first_row, n_rows, cols, out, stream);
  }
}

}  // namespace

DType fp8_kept_type(DType host, const void* data, int64_t rows, int64_t cols) {
  const int n = host == DType::kF8B32 ? 32 : 128;  // values a block
  const int64_t blocks = cols / n, bytes = block_bytes(host), per_group = 128 / n;
  const auto* p = static_cast<const uint8_t*>(data);
  bool per_row = true;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = p + r * blocks * bytes;
    for (int64_t b = 1; b < blocks; ++b) {
      // A block's scale against its group's first and its row's first.
      if (std::memcmp(row + (b - b % per_group) * bytes, row + b * bytes, sizeof(float)) != 0)
        return DType::kF32;
      per_row = per_row && std::memcmp(row, row + b * bytes, sizeof(float)) == 0;
    }
  }
  return per_row ? DType::kF8Row : DType::kF8G128;
}

DType CudaBackend::quantized_storage(DType host, int64_t rows, int64_t cols) const {
  const DType kept = kept_type(host);
  return kept != DType::kF32 && kept_layout_fits(kept, rows, cols) ? kept : DType::kF32;
}

Result<Tensor> CudaBackend::upload_kept(const Tensor& host, DType dtype,
                                        std::unique_ptr<Buffer>& storage) {
  const int64_t rows = host.rows(), cols = host.cols();
  // The FP8 types are one in the host's terms (fp8_kept_type tells them apart).
  const bool fits_type =
      is_kept_fp8(dtype) ? is_kept_fp8(kept_type(host.dtype)) : kept_type(host.dtype) == dtype;
  if (!fits_type || !kept_layout_fits(dtype, rows, cols))
    return invalid_argument("upload_weight: a " + std::string(dtype_name(host.dtype)) + " tensor " +
                            host.shape_string() + " cannot be kept as " +
                            std::string(dtype_name(dtype)) +
                            " (the device's layouts take whole 16-row stripes, and 64-column "
                            "chunks for 4-bit, 128-column groups for FP8)");
  PAGELLM_ASSIGN_OR_RETURN(storage, allocate_or_error(dtype_bytes(dtype, host.numel()),
                                                      "a weight " + host.shape_string()));
  ensure_quant_slices();
  if (is_kept_fp8(dtype)) note_fp8_without_tensor_cores();
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
    repack(staging, host.dtype, dst, dtype, rows, r0, nr, cols, stream_);
  }
  return dev;
}

void CudaBackend::fill_random_kept(Tensor& t, uint64_t seed, float lo, float hi) {
  const int64_t rows = t.rows(), cols = t.cols();
  PAGELLM_CHECK_MSG(kept_layout_fits(t.dtype, rows, cols),
                    "fill_random: a quantized tensor must fit the device layout");
  ensure_quant_slices();
  if (is_kept_fp8(t.dtype)) note_fp8_without_tensor_cores();
  // In pieces of whole stripes through the staging buffer; the blocks' random values are indexed
  // from the tensor's start, as the CPU backend's are.
  const int64_t stripe = dtype_bytes(t.dtype, 16 * cols);
  const int64_t stripes = std::max<int64_t>(1, kUploadChunkBytes / stripe);
  void* staging = ensure_upload_staging(std::min(rows / 16, stripes) * stripe);
  for (int64_t r0 = 0; r0 < rows; r0 += 16 * stripes) {
    const int64_t nr = std::min(16 * stripes, rows - r0);
    if (is_kept_fp8(t.dtype)) {
      launch_fp8_random(t.data, t.dtype, rows, r0, nr, cols, staging, seed, lo, hi, stream_);
    } else {
      launch_int4_random(static_cast<char*>(t.data) + dtype_bytes(t.dtype, r0 * cols), t.dtype, nr,
                         cols, r0 * cols / block_elems(t.dtype), staging, seed, lo, hi, stream_);
    }
  }
}

void CudaBackend::ensure_quant_slices() {
  // Made with the first quantized weight, before any step: a recording cannot allocate.
  if (quant_slice_ == nullptr)
    quant_slice_ = must_allocate(kQuantSliceBytes, "the quantized GEMM slice");
  if (side_quant_slice_ == nullptr)
    side_quant_slice_ = must_allocate(kQuantSliceBytes, "the side branch's quantized GEMM slice");
  if (fp8_matmul_ == nullptr && Fp8Matmul::supported()) {
    fp8_matmul_ = std::make_unique<Fp8Matmul>(stream_);
    side_fp8_matmul_ = std::make_unique<Fp8Matmul>(side_stream_);
  }
}

void CudaBackend::note_fp8_without_tensor_cores() {
  if (Fp8Matmul::supported() || fp8_fallback_noted_) return;
  fp8_fallback_noted_ = true;
  PAGELLM_LOG_INFO(
      "FP8 weights on %s, which has no FP8 tensor cores: decode reads them as FP8 (the GEMV), "
      "larger batches multiply them dequantized to bf16",
      name_.c_str());
}

void* CudaBackend::ensure_fp8_scratch(int64_t nbytes) {
  return grow_workspace(fp8_scratch_, nbytes, "matmul", "the FP8 activation scratch");
}

void CudaBackend::kept_matmul(const MatmulOperands& m, const Tensor* add_scratch) {
  const bool accumulate = add_scratch != nullptr;
  if (is_kept_fp8(m.w.dtype) && fp8_gemv_supported(m.x, m.w, m.out)) {
    launch_fp8_gemv(m.x, m.w, m.bias, m.bias_dtype, m.out, accumulate, stream_);
    return;
  }
  if (is_group_int4(m.w.dtype) && int4_gemv_supported(m.x, m.w, m.out)) {
    launch_int4_gemv(m.x, m.w, m.bias, m.bias_dtype, m.out, accumulate, stream_);
    return;
  }
  PAGELLM_CHECK_MSG(kept_layout_fits(m.w.dtype, m.w.n_rows, m.w.cols),
                    "matmul: a quantized weight not in the device layout");
  if (is_kept_fp8(m.w.dtype) && fp8_matmul_ != nullptr) {
    const int64_t done =
        fp8_matmul_->run(m.x, m.w, m.bias, m.bias_dtype, m.out, accumulate,
                         ensure_fp8_scratch(Fp8Matmul::scratch_bytes(m.x.n_rows, m.w.cols)));
    // The rows past the last whole four (at most three) through the GEMV.
    const int64_t rest = m.x.n_rows - done;
    if (done > 0 && rest > 0) {
      const int64_t out_esz = dtype_bytes(m.out.dtype, 1);
      const RowView x{static_cast<char*>(m.x.data) + done * m.x.ld * 2, m.x.dtype, rest, m.x.cols,
                      m.x.ld};
      const RowView out{static_cast<char*>(m.out.data) + done * m.out.ld * out_esz, m.out.dtype,
                        rest, m.out.cols, m.out.ld};
      launch_fp8_gemv(x, m.w, m.bias, m.bias_dtype, out, accumulate, stream_);
    }
    if (done > 0) return;
  }
  sliced_matmul(m, m.w.n_rows, 0, add_scratch);
}

void CudaBackend::sliced_matmul(const MatmulOperands& m, int64_t total_rows, int64_t first_row,
                                const Tensor* add_scratch) {
  const bool accumulate = add_scratch != nullptr;
  // Slices of equal whole stripes, each at most kQuantSliceBytes of bf16.
  const int64_t M = m.w.n_rows, K = m.w.cols;
  const int64_t most = std::max<int64_t>(16, kQuantSliceBytes / (2 * K) / 16 * 16);
  const int64_t n_slices = (M + most - 1) / most;
  const int64_t per = ((M + n_slices - 1) / n_slices + 15) / 16 * 16;
  const int64_t out_esz = dtype_bytes(m.out.dtype, 1);
  const int64_t bias_esz = m.bias != nullptr ? dtype_bytes(m.bias_dtype, 1) : 0;
  for (int64_t r0 = 0; r0 < M; r0 += per) {
    const int64_t rows = std::min(per, M - r0);
    dequantize_rows(m.w.data, m.w.dtype, total_rows, first_row + r0, rows, K, quant_slice_->data(),
                    stream_);
    const RowView w{quant_slice_->data(), DType::kBF16, rows, K, K};
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
