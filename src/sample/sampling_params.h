// SamplingParams: everything an OpenAI / vLLM request can set about how its tokens are chosen and
// when it stops, plus validate(), which the server calls at admission so that the sampler and the
// stop checker only ever see in-range values.
//
// Field meanings (the order in which the sampler applies them is in sampler.h):
//   temperature          0 (anything below kGreedyTemperature) = greedy argmax; else logits / T.
//   top_k                keep the k most likely tokens; -1 or 0 = off; >= vocab = off.
//   top_p                keep the smallest most-likely set whose probability is >= top_p; 1 = off.
//   min_p                keep tokens with p >= min_p * p_max; 0 = off.
//   repetition_penalty   HF / vLLM: every token that occurs in the prompt OR the output so far has
//                        its logit divided by the penalty if positive, multiplied if not; 1 = off.
//   presence_penalty     OpenAI: subtracted once from each token that occurs in the output so far.
//   frequency_penalty    OpenAI: subtracted once per occurrence in the output so far.
//   logit_bias           token -> bias added to the logit before anything else, [-100, 100].
//   seed                 same seed + same prompt -> same tokens; absent = drawn at admission.
//   logprobs             report the sampled token's logprob and the top-N alternatives (N <= 20).
//   prompt_logprobs      the same for every prompt token (N <= 20).
//   stop_token_ids       generation stops after one of these tokens (its text is not emitted).
//   stop                 generation stops at the first of these strings (not emitted, as OpenAI).
//   include_stop_str_in_output  vLLM extension: emit the stop string / stop token's text too.
//   max_tokens           at most this many generated tokens ("length"); absent = the context limit.
//   min_tokens           EOS and stop_token_ids are suppressed, and stops ignored, until this many.
//   ignore_eos           keep generating past EOS.
//   n                    number of completions sharing the prompt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm {

// Temperatures below this are treated as greedy: dividing by a smaller value only magnifies fp32
// rounding noise (vLLM uses the same 1e-5 epsilon).
inline constexpr float kGreedyTemperature = 1e-5f;
// OpenAI allows [0, 2]; vLLM allows any non-negative value. We accept up to 100: above that the
// distribution is uniform to within fp32 resolution for any realistic logit range.
inline constexpr float kMaxTemperature = 100.0f;
// OpenAI's top_logprobs limit, and vLLM's default max_logprobs.
inline constexpr int32_t kMaxLogprobs = 20;
// OpenAI's logit_bias range; +-100 means "always" / "never" in practice.
inline constexpr float kMaxLogitBias = 100.0f;
// OpenAI's (and vLLM's) range for presence_penalty and frequency_penalty: [-2, 2].
inline constexpr float kMaxPresenceFrequencyPenalty = 2.0f;
// OpenAI's limit on n.
inline constexpr int32_t kMaxN = 128;

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};

struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias;  // token ids unique
  std::optional<uint64_t> seed;
  std::optional<int32_t> logprobs;         // top-N count, [0, kMaxLogprobs]
  std::optional<int32_t> prompt_logprobs;  // top-N count, [0, kMaxLogprobs]
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // non-empty UTF-8 strings
  bool include_stop_str_in_output = false;
  std::optional<int32_t> max_tokens;  // >= 1 when set
  int32_t min_tokens = 0;             // [0, max_tokens]
  bool ignore_eos = false;
  int32_t n = 1;  // [1, kMaxN]

  bool is_greedy() const { return temperature < kGreedyTemperature; }
  // Whether any of the three penalties changes a logit (they need the token history).
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }

  // Checks every field's range; the error names the field and its value, e.g.
  //   "sampling params: 'top_p' must be in (0, 1], got 1.5".
  // vocab_size > 0 also checks the token ids in logit_bias and stop_token_ids against [0, vocab).
  Status validate(int32_t vocab_size = 0) const;
};

}  // namespace pagellm
