#include "sample/stop_checker.h"

#include <algorithm>

#include "core/check.h"

namespace pagellm {

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids)
    : stop_strings_(params.stop),
      stop_token_ids_(params.stop_token_ids),
      max_tokens_(params.max_tokens),
      min_tokens_(params.min_tokens),
      include_stop_(params.include_stop_str_in_output) {
  if (!params.ignore_eos) eos_token_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
  // Empty stop strings are rejected by validate(); drop any that slip through rather than
  // matching everywhere.
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stop_strings_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

std::string StopChecker::emit(size_t n_bytes) {
  std::string out = held_.substr(0, n_bytes);
  held_.erase(0, n_bytes);
  text_ += out;
  return out;
}

size_t StopChecker::partial_match_length() const {
  size_t best = 0;
  for (const std::string& s : stop_strings_) {
    // Proper prefixes only: a complete occurrence is either a stop (handled before) or was
    // ineligible (before min_tokens) and must not be held forever.
    for (size_t len = std::min(s.size() - 1, held_.size()); len > best; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

StopUpdate StopChecker::append(int32_t token, std::string_view delta) {
  PAGELLM_CHECK_MSG(!finished(), "StopChecker::append after the sequence finished");
  StopUpdate update;
  ++n_tokens_;
  const bool eligible = n_tokens_ >= min_tokens_;

  const bool is_stop_token =
      std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token) != stop_token_ids_.end();
  const bool is_eos =
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
  if (eligible && (is_stop_token || is_eos)) {
    update.text = emit(held_.size());
    if (include_stop_) {
      update.text.append(delta);
      text_.append(delta);
    }
    finish_ = update.finish = FinishReason::kStop;
    if (is_stop_token) update.stop_token = token;
    return update;
  }

  const size_t old_size = held_.size();
  held_.append(delta);
  if (eligible && !delta.empty()) {
    // Only occurrences that end in the new bytes: earlier ones were found (and stopped) before,
    // or were ineligible. The held text contains every possible start of such an occurrence.
    size_t best_start = std::string::npos, best_end = std::string::npos;
    const std::string* best = nullptr;
    for (const std::string& s : stop_strings_) {
      const size_t from = old_size >= s.size() - 1 ? old_size - (s.size() - 1) : 0;
      const size_t pos = held_.find(s, from);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_start = pos;
        best_end = end;
        best = &s;
      }
    }
    if (best != nullptr) {
      update.text = emit(include_stop_ ? best_end : best_start);
      held_.clear();
      finish_ = update.finish = FinishReason::kStop;
      update.stop_string = *best;
      return update;
    }
  }

  if (max_tokens_ && n_tokens_ >= *max_tokens_) {
    update.text = emit(held_.size());
    finish_ = update.finish = FinishReason::kLength;
    return update;
  }
  update.text = emit(held_.size() - partial_match_length());
  return update;
}

std::string StopChecker::finish(FinishReason reason) {
  PAGELLM_CHECK(reason != FinishReason::kNone);
  if (finished()) return {};
  finish_ = reason;
  return emit(held_.size());
}

}  // namespace pagellm
