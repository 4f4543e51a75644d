// UTF-8 and Unicode helpers for the tokenizer pipeline. Character properties come from utf8proc so
// that they follow the Unicode tables, with the few places where Hugging Face `tokenizers` (Rust's
// `char` methods) differ from a plain category test spelled out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pagellm::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at `s[*pos]` and advances `*pos`. The input must be valid UTF-8
// (every string inside the pipeline is: input is sanitized first).
char32_t next_code_point(std::string_view s, size_t* pos);
// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for a stray byte).
inline size_t utf8_len(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
}
void append_utf8(std::string* out, char32_t cp);
std::string to_utf8(char32_t cp);

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Rust's String::from_utf8_lossy: every maximal ill-formed subpart becomes one U+FFFD (the Unicode
// "substitution of maximal subparts" practice). Valid input is returned unchanged.
std::string utf8_lossy(std::string_view s);
// Length of the longest prefix of `s` that ends on a character boundary and does not end inside a
// sequence that could still be completed by more bytes. Used by streaming decoders.
size_t utf8_complete_prefix(std::string_view s);

// Rust `char::is_whitespace` (Unicode White_Space).
bool is_whitespace(char32_t c);
// Rust `char::is_alphanumeric` (Alphabetic or Numeric: categories L*, Nl, Nd, No, plus Other_Alphabetic
// marks), approximated with general categories L*, N* and Mc/Mn with the Alphabetic property.
bool is_alphanumeric(char32_t c);
// Rust `char::is_numeric`: general categories Nd, Nl, No.
bool is_numeric(char32_t c);
// tokenizers' punctuation test: ASCII punctuation or a Unicode P* category.
bool is_punctuation(char32_t c);
// A character of Rust regex's Unicode `\w`: Alphabetic, marks, Nd, Pc and the join controls.
bool is_word_char(char32_t c);
// Unicode general category Mn (nonspacing mark).
bool is_nonspacing_mark(char32_t c);

// Rust `char::to_lowercase` appended to `out` (the full mapping: U+0130 becomes "i\u0307").
void append_lowercase(std::string* out, char32_t c);

}  // namespace pagellm::tok
