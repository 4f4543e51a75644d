// LogitsHead: the last step of every causal LM here. Gathers the hidden rows whose logits the
// batch wants (StepBatch::logits_rows; a decode step wants every row in order, so its rows are
// read where they are), multiplies them by the LM head and, when asked, copies f32
// logits to the host (converting on the device first when activations are not f32); otherwise
// the logits stay on the device for the device sampler (logits()). Its scratch grows with
// the largest n_logits seen and is reused, so steady-state steps allocate nothing.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/model.h"

namespace pagellm {

// Copies device logits (act [m, V]) to host f32, converting them on the device first when
// activations are not f32, through its own device f32 buffer grown to the largest batch seen.
// For logits from anywhere: the LM head's, or a replayed decode graph's.
class LogitsDownload {
 public:
  explicit LogitsDownload(Backend& backend) : backend_(backend) {}
  //   logits act [m, V] on the device; out host f32 [m, V]. Waits for the copy.
  void operator()(const Tensor& logits, float* out);

 private:
  Backend& backend_;
  std::unique_ptr<Buffer> f32_;
};

class LogitsHead {
 public:
  explicit LogitsHead(Backend& backend) : backend_(backend) {}

  //   h act [n_tokens, D] (final-normed hidden states); lm_head [V, D]; out host f32 [n_logits, V]
  //   or nullptr (keep them on the device).
  void run(const Tensor& h, const StepBatch& batch, const Tensor& lm_head, float* out);
  // The last run's logits, act [n_logits, V] on the device.
  Tensor logits() const { return last_; }
  // Copies them to host f32 [n_logits, V] and waits.
  void download(float* out) { download_(last_, out); }

 private:
  void reserve(int64_t m, int64_t d, int64_t v);

  Backend& backend_;
  int64_t capacity_ = 0;
  std::unique_ptr<Buffer> buf_;
  Tensor last_;
  Tensor hl_, logits_;  // [cap, D], [cap, V] act
  LogitsDownload download_{backend_};
};

}  // namespace pagellm
