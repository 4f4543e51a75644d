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
  buf_ = backend_.must_allocate(hl_bytes + lg_bytes, "the LM head's rows and logits");
  char* p = static_cast<char*>(buf_->data());
  hl_ = Tensor(p, dt, {cap, d}, backend_.device());
  logits_ = Tensor(p + hl_bytes, dt, {cap, v}, backend_.device());
  capacity_ = cap;
}

void LogitsHead::run(const Tensor& h, const StepBatch& batch, const Tensor& lm_head, float* out) {
  const int64_t m = batch.n_logits;
  last_ = Tensor();
  if (m == 0) return;
  reserve(m, h.cols(), lm_head.size(0));
  Tensor logits = logits_.slice_rows(0, m);  // [m, V]
  if (batch.logits_every_token && h.rows() == m) {
    // A decode step wants every row in order: a gather would copy h as it is (one latency-bound
    // kernel on each step's chain).
    backend_.matmul(h, lm_head, Tensor(), logits);
  } else {
    Tensor hl = hl_.slice_rows(0, m);  // [m, D]
    backend_.gather_rows(h, batch.logits_rows, hl);
    backend_.matmul(hl, lm_head, Tensor(), logits);
  }
  last_ = logits;
  if (out != nullptr) download_(logits, out);
}

void LogitsDownload::operator()(const Tensor& logits, float* out) {
  const int64_t m = logits.rows(), v = logits.cols();
  if (m == 0) return;
  if (logits.dtype == DType::kF32) {
    backend_.copy_to_host(out, logits.data, logits.nbytes());
    return;
  }
  if (!f32_ || f32_->nbytes() < m * v * 4) f32_ = backend_.must_allocate(m * v * 4, "f32 logits");
  Tensor f32 = f32_->view(DType::kF32, {m, v});
  backend_.to_f32(logits, f32);
  backend_.copy_to_host(out, f32.data, f32.nbytes());
}

}  // namespace pagellm
