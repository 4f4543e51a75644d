#include "sample/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace pagellm {
namespace {

template <typename T>
Status field_error(const char* field, const char* requirement, T value) {
  std::ostringstream os;
  os << "sampling params: '" << field << "' must be " << requirement << ", got " << value;
  return invalid_argument(os.str());
}

}  // namespace

Status SamplingParams::validate(int32_t vocab_size) const {
  // NaN fails every comparison below, so each float check is written as "accept if in range".
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature))
    return field_error("temperature", "in [0, 100]", temperature);
  if (top_k < -1) return field_error("top_k", "-1 or 0 (off) or >= 1", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return field_error("top_p", "in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return field_error("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty)))
    return field_error("repetition_penalty", "a finite number > 0", repetition_penalty);
  if (!(std::fabs(presence_penalty) <= kMaxPresenceFrequencyPenalty))
    return field_error("presence_penalty", "in [-2, 2]", presence_penalty);
  if (!(std::fabs(frequency_penalty) <= kMaxPresenceFrequencyPenalty))
    return field_error("frequency_penalty", "in [-2, 2]", frequency_penalty);

  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const LogitBias& b = logit_bias[i];
    if (b.token < 0 || (vocab_size > 0 && b.token >= vocab_size)) {
      std::ostringstream os;
      os << "sampling params: 'logit_bias' token " << b.token << " is outside the vocabulary";
      if (vocab_size > 0) os << " [0, " << vocab_size << ")";
      return invalid_argument(os.str());
    }
    if (!(std::fabs(b.bias) <= kMaxLogitBias)) {
      std::ostringstream os;
      os << "sampling params: 'logit_bias' for token " << b.token << " must be in [-100, 100], got "
         << b.bias;
      return invalid_argument(os.str());
    }
  }
  if (logit_bias.size() > 1) {
    std::vector<int32_t> ids;
    ids.reserve(logit_bias.size());
    for (const LogitBias& b : logit_bias) ids.push_back(b.token);
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end())
      return invalid_argument("sampling params: 'logit_bias' lists token " + std::to_string(*dup) +
                              " twice");
  }

  if (logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs))
    return field_error("logprobs", "in [0, 20]", *logprobs);
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs))
    return field_error("prompt_logprobs", "in [0, 20]", *prompt_logprobs);

  for (int32_t t : stop_token_ids) {
    if (t < 0 || (vocab_size > 0 && t >= vocab_size)) {
      std::ostringstream os;
      os << "sampling params: 'stop_token_ids' token " << t << " is outside the vocabulary";
      if (vocab_size > 0) os << " [0, " << vocab_size << ")";
      return invalid_argument(os.str());
    }
  }
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty())
      return invalid_argument("sampling params: 'stop' string " + std::to_string(i) + " is empty");

  if (max_tokens && *max_tokens < 1) return field_error("max_tokens", ">= 1", *max_tokens);
  if (min_tokens < 0) return field_error("min_tokens", ">= 0", min_tokens);
  if (max_tokens && min_tokens > *max_tokens) {
    std::ostringstream os;
    os << "sampling params: 'min_tokens' (" << min_tokens << ") must be <= 'max_tokens' ("
       << *max_tokens << ")";
    return invalid_argument(os.str());
  }
  if (n < 1 || n > kMaxN) return field_error("n", "in [1, 128]", n);
  return Status::ok_status();
}

}  // namespace pagellm
