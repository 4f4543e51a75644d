// A compiled Unicode regular expression (PCRE2 in UTF + UCP mode, JIT-compiled when available) with
// the matching semantics of the Oniguruma regexes that Hugging Face `tokenizers` uses for Split,
// Replace and ByteLevel: leftmost matches found left to right, an empty match advancing one character.
//
// Like Oniguruma's Ruby syntax, `^` and `$` match at line boundaries (PCRE2_MULTILINE).
// `\s` and `\S` are rewritten to Unicode White_Space (Oniguruma's meaning) before compiling, since
// PCRE2's UCP `\s` leaves out U+0085 and PCRE2 and Oniguruma disagree on a few other characters.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace pagellm::tok {

class Regex {
 public:
  // `what` names the pattern's owner in error messages ("pre_tokenizer Split").
  static Result<Regex> compile(const std::string& pattern, const std::string& what);
  // A regex matching `literal` exactly.
  static Result<Regex> literal(const std::string& literal, const std::string& what);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Calls `on_match(start, end)` for each match in `subject` (valid UTF-8), in order. A failure of
  // the matcher itself (resource limits) is reported as an error rather than silently truncating.
  Status find_all(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// The rewrite applied before compiling (exposed for tests).
std::string rewrite_whitespace_classes(const std::string& pattern);

}  // namespace pagellm::tok
