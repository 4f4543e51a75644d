#include "tokenizer/detokenizer.h"

#include <span>

namespace pagellm {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}
}  // namespace

Result<std::string> IncrementalDetokenizer::add(int32_t id) {
  ids_.push_back(id);
  return step(false);
}

Result<std::string> IncrementalDetokenizer::finish() { return step(true); }

Result<std::string> IncrementalDetokenizer::step(bool final) {
  if (read_ == ids_.size()) return std::string();
  if (!final) {
    // The last id the decoder will see (skipped special tokens vanish, so byte runs join across them).
    for (size_t i = ids_.size(); i > read_; --i) {
      const int32_t id = ids_[i - 1];
      if (skip_special_ && tok_.is_special(id)) continue;
      if (tok_.is_byte_fallback_token(id)) return std::string();
      break;
    }
  }
  const std::span<const int32_t> window(ids_.data() + prefix_, ids_.size() - prefix_);
  PAGELLM_ASSIGN_OR_RETURN(std::string text, tok_.decode(window, skip_special_));
  if (!final && ends_with_replacement(text)) return std::string();
  // The window's text must extend its context; if a decoder rewrote the context (it never does for
  // the pipelines we know), hold back and let a later step or finish() sort it out.
  if (text.size() < context_.size() || text.compare(0, context_.size(), context_) != 0) {
    if (!final) return std::string();
    return internal_error("incremental detokenizer: the decoded window does not extend its context");
  }
  std::string delta = text.substr(context_.size());
  // Slide the window: what was new becomes the context of the next step, unless it decodes to
  // nothing on its own (skipped special tokens, a lone "\u2581" that a first-token rule strips):
  // then a later first token would lose its leading space, so the older context stays.
  const std::span<const int32_t> fresh(ids_.data() + read_, ids_.size() - read_);
  PAGELLM_ASSIGN_OR_RETURN(std::string fresh_text, tok_.decode(fresh, skip_special_));
  if (!fresh_text.empty()) {
    prefix_ = read_;
    context_ = std::move(fresh_text);
  } else {
    context_ = std::move(text);
  }
  read_ = ids_.size();
  return delta;
}

}  // namespace pagellm
