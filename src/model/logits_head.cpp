#include "model/logits_head.h"

#include <algorithm>

namespace pagellm {

void LogitsHead::reserve(int64_t m, int64_t d, int64_t v) {
  if (m <= capacity_) return;
  const DType dt = backend_.activation_dtype();
  const int64_t cap = std::max<int64_t>(m, 1);
  auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const int64_t hl_bytes = aligned(dtype_bytes(dt, cap * d));
  const int64_t lg_bytes = aligned(dtype_bytes(dt, cap * v));
  const int64_t f32_bytes = dt == DType::kF32 ? 0 : aligned(cap * v * 4);
  buf_ = backend_.allocate(hl_bytes + lg_bytes + f32_bytes);
  char* p = static_cast<char*>(buf_->data());
  hl_ = Tensor(p, dt, {cap, d}, backend_.device());
  logits_ = Tensor(p + hl_bytes, dt, {cap, v}, backend_.device());
  if (f32_bytes) logits_f32_ = Tensor(p + hl_bytes + lg_bytes, DType::kF32, {cap, v}, backend_.device());
  capacity_ = cap;
}

void LogitsHead::run(const Tensor& h, const StepBatch& batch, const Tensor& lm_head, float* out) {
  const int64_t m = batch.n_logits;
  last_ = Tensor();
  if (m == 0) return;
  reserve(m, h.cols(), lm_head.size(0));
  Tensor hl = hl_.slice_rows(0, m);          // [m, D]
  Tensor logits = logits_.slice_rows(0, m);  // [m, V]
  backend_.gather_rows(h, batch.logits_rows, hl);
  backend_.matmul(hl, lm_head, Tensor(), logits);
  last_ = logits;
  if (out != nullptr) logits_to_host(backend_, logits, logits_f32_, out);
}

void logits_to_host(Backend& backend, const Tensor& logits, const Tensor& f32_scratch, float* out) {
  if (logits.dtype == DType::kF32) {
    backend.copy_to_host(out, logits.data, logits.nbytes());
    return;
  }
  Tensor lf = f32_scratch.slice_rows(0, logits.rows());
  backend.to_f32(logits, lf);
  backend.copy_to_host(out, lf.data, lf.nbytes());
}

void LogitsDownload::operator()(const Tensor& logits, float* out) {
  const int64_t m = logits.rows(), v = logits.cols();
  if (m == 0) return;
  Tensor f32;
  if (logits.dtype != DType::kF32) {
    if (!f32_ || f32_->nbytes() < m * v * 4) f32_ = backend_.allocate(m * v * 4);
    f32 = f32_->view(DType::kF32, {m, v});
  }
  logits_to_host(backend_, logits, f32, out);
}

}  // namespace pagellm
