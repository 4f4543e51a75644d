// Jinja lexer with the whitespace rules transformers renders chat templates with: trim_blocks
// (drop the first newline after a block or comment tag), lstrip_blocks (drop spaces and tabs
// before a block or comment tag that starts its line), `-`/`+` whitespace control, newlines
// normalized to \n and one trailing newline dropped (keep_trailing_newline=False).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::jinja {

enum class TokenType : uint8_t {
  kData,        // literal template text (also the body of {% raw %})
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the decoded value
  kInteger,
  kFloat,
  kOperator,    // text holds the operator: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } ;
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  size_t pos = 0;  // byte offset into the normalized source
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Newline normalization as jinja2 does it before lexing; token positions refer to this text.
std::string normalize_newlines(std::string_view source, bool keep_trailing_newline);

// Throws JinjaError (with pos) on a lexical error. `source` must already be normalized.
std::vector<Token> lex(std::string_view source, const LexOptions& options);

}  // namespace pagellm::jinja
