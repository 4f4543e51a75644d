#include "runtime/draft_picker.h"

#include <algorithm>

#include "core/check.h"
#include "sample/logits_processors.h"
#include "sample/rejection_sampler.h"

namespace pagellm {

DraftPicker::DraftPicker(Backend& backend, const SamplerConfig& sampler)
    : backend_(backend), sampler_(sampler), vocab_(sampler.vocab_size) {}

void DraftPicker::pick(const Tensor& logits, std::span<const DraftRow> rows,
                       std::vector<int32_t>& next) {
  const int32_t n = static_cast<int32_t>(rows.size());
  next.assign(rows.size(), -1);
  if (n == 0) return;
  PAGELLM_CHECK(logits.rows() >= n && logits.cols() == vocab_);
  const bool draws =
      std::any_of(rows.begin(), rows.end(), [](const DraftRow& r) { return r.p->params; });
  if (backend_.supports_sampling() && !draws) {  // only the tokens come back
    device_rows_.assign(rows.size(), DeviceSampleRow{});
    for (int32_t i = 0; i < n; ++i) {
      device_rows_[i].logits_row = i;
      device_rows_[i].flags = kSampleGreedy;
    }
    results_.resize(rows.size());
    backend_.sample(logits, {device_rows_.data(), n}, results_.data());
    for (int32_t i = 0; i < n; ++i)
      if (results_[i].status == DeviceSampleStatus::kOk) next[i] = results_[i].token;
    return;
  }
  host_logits_.resize(static_cast<size_t>(n) * vocab_);
  download_(logits.slice_rows(0, n), host_logits_.data());
  for (int32_t i = 0; i < n; ++i) {
    const std::span<const float> row(host_logits_.data() + static_cast<size_t>(i) * vocab_,
                                     static_cast<size_t>(vocab_));
    const ProposalRequest& p = *rows[i].p;
    if (!p.params) {
      next[i] = argmax_token(row);
      continue;
    }
    const std::vector<int32_t>& h = *rows[i].history;
    const SampleRow sr{p.params, p.tokens.first(static_cast<size_t>(p.n_prompt)), h, p.seed};
    std::vector<TokenProb> q;
    if (!sampler_.distribution(row, sr, q).ok()) continue;  // no guess (e.g. a non-finite row)
    next[i] = draw_from(q, uniform01(stream_seed(p.seed, SpecStream::kDraft), h.size()));
    p.draft_probs->push_back(std::move(q));
  }
}

bool add_guess(const ProposalRequest& p, std::vector<int32_t>& history, int32_t token) {
  p.draft->push_back(token);
  if (p.params) history.push_back(token);
  return static_cast<int32_t>(p.draft->size()) < p.max_tokens;
}

}  // namespace pagellm
