// StopChecker: decides when a sequence is finished and which of its text may be streamed, one
// generated token at a time. It takes the token id and the token's detokenized text delta (the
// incremental detokenizer's output, possibly empty) and returns the text that is safe to send now.
//
// Rules, checked in this order after each token (n = tokens generated so far, this one included):
//   1. Stop token: the token is in stop_token_ids, or is an EOS id and !ignore_eos, and
//      n >= min_tokens  -> finish "stop". The token's own text is not emitted (unless
//      include_stop_str_in_output); the held-back text is released.
//   2. Stop string: once n >= min_tokens, the first stop string occurrence that ends inside this
//      token's delta -> finish "stop"; the text is cut just before the occurrence (or just after
//      it with include_stop_str_in_output) and everything after it is dropped. "First" is the
//      occurrence that completes earliest in the character stream, the longest on a tie, so
//      the result is the same however the text is split into deltas.
//   3. Length: n >= max_tokens -> finish "length"; the held-back text is released.
//   Otherwise the text is emitted except for the longest suffix that is a proper prefix of some
//   stop string: it could still grow into a stop string, so it is held back until it can no
//   longer match, or until the sequence finishes. No part of a stop string is ever streamed.
// Matching is bytewise on UTF-8. Because UTF-8 is self-synchronizing, an occurrence of a valid
// UTF-8 stop string always starts on a character boundary, so cuts never split a character
// as long as the deltas themselves end on character boundaries (the detokenizer's job).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/finish_reason.h"
#include "sample/sampling_params.h"

namespace pagellm {


struct StopUpdate {
  std::string text;  // safe to stream now; may be empty
  FinishReason finish = FinishReason::kNone;
  // What matched (vLLM's stop_reason): a stop_token_ids entry or a stop string. Both empty for
  // EOS and for length.
  std::optional<int32_t> stop_token;
  std::optional<std::string> stop_string;
};

class StopChecker {
 public:
  // eos_token_ids: the model's EOS ids (ignored with params.ignore_eos).
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids);

  // Feeds one generated token and its text delta. Must not be called once finished().
  StopUpdate append(int32_t token, std::string_view delta);

  // Ends the sequence for an outside reason (kLength for the context limit, kAbort) and returns
  // the held-back text. After the sequence has already finished it changes nothing and returns "".
  std::string finish(FinishReason reason);

  bool finished() const { return finish_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_; }
  int32_t n_tokens() const { return n_tokens_; }
  // Everything emitted so far (the non-streaming response text once finished).
  const std::string& text() const { return text_; }
  // Bytes currently held back.
  size_t n_held() const { return held_.size(); }

 private:
  // Longest suffix of held_ that is a proper prefix of some stop string.
  size_t partial_match_length() const;
  std::string emit(size_t n_bytes);  // moves the first n bytes of held_ to the output

  std::vector<std::string> stop_strings_;
  std::vector<int32_t> stop_token_ids_;
  std::vector<int32_t> eos_token_ids_;
  std::optional<int32_t> max_tokens_;
  int32_t min_tokens_ = 0;
  bool include_stop_ = false;
  size_t max_stop_len_ = 0;

  int32_t n_tokens_ = 0;
  FinishReason finish_ = FinishReason::kNone;
  std::string held_;
  std::string text_;
};

}  // namespace pagellm
