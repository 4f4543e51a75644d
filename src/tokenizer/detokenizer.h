// Streaming detokenization: feed generated ids one at a time, get text deltas.
//
// Guarantees: every delta is valid UTF-8 (never half a character), and the concatenation of all
// deltas plus finish() equals tokenizer.decode(all ids) exactly. It decodes a sliding window of
// ids: `prefix_` .. `read_` is context already emitted, read_ .. end is new. The delta is the text
// the window gained over its context, so decoders that treat the first token specially
// (SentencePiece's leading-space strip, Metaspace) see the same context both times. Text is held
// back while it ends in U+FFFD (an incomplete byte sequence a later token may complete) or while
// the last id is a byte-fallback token (the ByteFallback decoder decides a byte run's text only
// once the run ends: one bad byte turns the whole run into U+FFFDs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tok_(tokenizer), skip_special_(skip_special_tokens) {}

  // Adds one id; returns the text it completes (often empty).
  Result<std::string> add(int32_t id);
  // Returns whatever was held back. Call once, at the end of the stream.
  Result<std::string> finish();

  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  Result<std::string> step(bool final);

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;       // window start: context for the decoder
  size_t read_ = 0;         // ids before this were emitted
  std::string context_;     // decode(ids_[prefix_, read_))
};

}  // namespace pagellm
