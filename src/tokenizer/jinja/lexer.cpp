#include "tokenizer/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/value.h"

namespace pagellm::jinja {

std::string normalize_newlines(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

[[noreturn]] void lex_fail(std::string msg, size_t pos) { throw JinjaError{std::move(msg), pos}; }

// Length in bytes of the Python-whitespace code point at s[i] (0 if none).
size_t space_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (i + len > s.size()) return 0;
  std::u32string cps = utf8_decode(s.substr(i, len));
  return cps.size() == 1 && py_isspace(cps[0]) ? len : 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    const size_t l = space_len(s, i);
    if (!l) break;
    i += l;
  }
  return i;
}

bool all_spaces(std::string_view s) { return skip_spaces(s, 0) == s.size(); }

// Python's str.rstrip() on UTF-8 text.
std::string_view rstrip_spaces(std::string_view s) {
  std::u32string cps = utf8_decode(s);
  size_t end = cps.size();
  while (end > 0 && py_isspace(cps[end - 1])) --end;
  return s.substr(0, utf8_encode(std::u32string_view(cps).substr(0, end)).size());
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// (\d+_)*\d+ starting at i; returns the end or npos.
size_t match_digits(std::string_view s, size_t i) {
  if (i >= s.size() || !is_digit(s[i])) return std::string_view::npos;
  while (true) {
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i + 1 < s.size() && s[i] == '_' && is_digit(s[i + 1])) {
      ++i;
      continue;
    }
    return i;
  }
}

// jinja2's float_re; returns the end or npos.
size_t match_float(std::string_view s, size_t i) {
  if (i > 0 && s[i - 1] == '.') return std::string_view::npos;
  size_t p = match_digits(s, i);
  if (p == std::string_view::npos) return p;
  size_t frac_end = std::string_view::npos;
  if (p < s.size() && s[p] == '.') frac_end = match_digits(s, p + 1);
  const size_t q = frac_end != std::string_view::npos ? frac_end : p;
  if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
    size_t r = q + 1;
    if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
    const size_t e = match_digits(s, r);
    if (e != std::string_view::npos) return e;
  }
  return frac_end;
}

int digit_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return 99;
}

// jinja2's integer_re; returns the end and the value.
size_t match_integer(std::string_view s, size_t i, int64_t* value, bool* overflow) {
  *overflow = false;
  auto accumulate = [&](size_t start, int base) -> size_t {
    // (_?digit)+
    size_t p = start;
    unsigned __int128 v = 0;
    bool any = false;
    while (p < s.size()) {
      size_t q = p;
      if (s[q] == '_') ++q;
      if (q >= s.size() || digit_value(s[q]) >= base) break;
      v = v * base + digit_value(s[q]);
      if (v > static_cast<unsigned __int128>(INT64_MAX)) *overflow = true;
      p = q + 1;
      any = true;
    }
    if (!any) return std::string_view::npos;
    *value = *overflow ? 0 : static_cast<int64_t>(v);
    return p;
  };
  if (s[i] == '0' && i + 1 < s.size()) {
    const char x = s[i + 1];
    const int base = (x == 'b' || x == 'B') ? 2 : (x == 'o' || x == 'O') ? 8 : (x == 'x' || x == 'X') ? 16 : 0;
    if (base) {
      const size_t e = accumulate(i + 2, base);
      if (e != std::string_view::npos) return e;
    }
  }
  if (s[i] == '0') {
    // 0(_?0)*
    size_t p = i + 1;
    while (p < s.size()) {
      size_t q = p;
      if (s[q] == '_') ++q;
      if (q < s.size() && s[q] == '0') p = q + 1;
      else break;
    }
    *value = 0;
    return p;
  }
  if (s[i] >= '1' && s[i] <= '9') return accumulate(i, 10);
  return std::string_view::npos;
}

// Python's unicode-escape decoding of a string literal body.
std::string decode_string(std::string_view body, size_t pos) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          if (i + 1 >= body.size() || digit_value(body[i + 1]) >= 16) {
            lex_fail(std::string("truncated \\") + e + " escape in string literal", pos);
          }
          cp = cp * 16 + digit_value(body[++i]);
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          lex_fail("invalid code point escape in string literal", pos);
        }
        utf8_append(out, cp);
        break;
      }
      case 'N': lex_fail("\\N{...} escapes are not supported", pos);
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          utf8_append(out, cp);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& opts) : s_(src), opts_(opts) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string_view::npos) {
        emit_data(s_.substr(pos_), pos_);
        pos_ = s_.size();
        break;
      }
      const char kind = s_[tag + 1];
      char sign = 0;
      if (tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+')) sign = s_[tag + 2];
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(tag, &raw_end);
      std::string_view text = s_.substr(pos_, tag - pos_);
      emit_data(strip_before(text, sign, kind != '{'), pos_);
      line_starting_ = false;
      if (raw) {
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment(tag + 2 + (sign ? 1 : 0));
      } else {
        tokens_.push_back({kind == '%' ? TokenType::kBlockBegin : TokenType::kVarBegin, "", 0, 0, tag});
        pos_ = tag + 2 + (sign ? 1 : 0);
        lex_tag(kind == '%');
      }
    }
    tokens_.push_back({TokenType::kEof, "", 0, 0, s_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string_view::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '%' || s_[i + 1] == '{' || s_[i + 1] == '#')) return i;
    }
    return std::string_view::npos;
  }

  void emit_data(std::string_view text, size_t pos) {
    if (!text.empty()) tokens_.push_back({TokenType::kData, std::string(text), 0, 0, pos});
  }

  // The OptionalLStrip rule of jinja2's lexer: `-` strips all whitespace before the tag; otherwise
  // lstrip_blocks strips spaces between the line start and a block/comment tag.
  std::string_view strip_before(std::string_view text, char sign, bool block_like) const {
    if (sign == '-') return rstrip_spaces(text);
    if (sign == '+' || !opts_.lstrip_blocks || !block_like) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_spaces(text.substr(l_pos))) {
      return text.substr(0, l_pos);
    }
    return text;
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%})
  bool match_raw_begin(size_t tag, size_t* end) const {
    size_t p = tag + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
    p = skip_spaces(s_, p);
    if (s_.compare(p, 3, "raw") != 0) return false;
    p = skip_spaces(s_, p + 3);
    if (s_.compare(p, 3, "-%}") == 0) {
      *end = skip_spaces(s_, p + 3);
      return true;
    }
    if (s_.compare(p, 2, "%}") == 0) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  void lex_raw(size_t body_start) {
    const size_t begin = pos_;
    for (size_t i = s_.find("{%", body_start); i != std::string_view::npos; i = s_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
      p = skip_spaces(s_, p);
      if (s_.compare(p, 6, "endraw") != 0) continue;
      p = skip_spaces(s_, p + 6);
      size_t end;
      if (s_.compare(p, 3, "+%}") == 0) end = p + 3;
      else if (s_.compare(p, 3, "-%}") == 0) end = skip_spaces(s_, p + 3);
      else if (s_.compare(p, 2, "%}") == 0) end = p + 2 + (opts_.trim_blocks && p + 2 < s_.size() && s_[p + 2] == '\n');
      else continue;
      line_starting_ = false;
      emit_data(strip_before(s_.substr(body_start, i - body_start), sign, true), body_start);
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    lex_fail("Missing end of raw directive", begin);
  }

  void lex_comment(size_t body_start) {
    const size_t j = s_.find("#}", body_start);
    if (j == std::string_view::npos) lex_fail("Missing end of comment tag", pos_);
    size_t end = j + 2;
    const char before = j > body_start ? s_[j - 1] : 0;
    if (before == '-') end = skip_spaces(s_, end);
    else if (before != '+' && opts_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
    pos_ = end;
    line_starting_ = s_[end - 1] == '\n';
  }

  // Tokens inside {% %} or {{ }} up to and including the end tag.
  void lex_tag(bool block) {
    std::vector<char> balance;
    while (true) {
      if (pos_ >= s_.size()) {
        lex_fail(block ? "unexpected end of template, expected end of block tag '%}'"
                       : "unexpected end of template, expected end of print statement '}}'",
                 pos_);
      }
      if (balance.empty()) {
        const size_t start = pos_;
        size_t end = 0;
        if (block) {
          if (s_.compare(pos_, 3, "+%}") == 0) end = pos_ + 3;
          else if (s_.compare(pos_, 3, "-%}") == 0) end = skip_spaces(s_, pos_ + 3);
          else if (s_.compare(pos_, 2, "%}") == 0) {
            end = pos_ + 2;
            if (opts_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
          }
        } else {
          if (s_.compare(pos_, 3, "-}}") == 0) end = skip_spaces(s_, pos_ + 3);
          else if (s_.compare(pos_, 2, "}}") == 0) end = pos_ + 2;
        }
        if (end) {
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", 0, 0, start});
          pos_ = end;
          line_starting_ = s_[end - 1] == '\n';
          return;
        }
      }
      const size_t sp = space_len(s_, pos_);
      if (sp) {
        pos_ = skip_spaces(s_, pos_);
        continue;
      }
      const char c = s_[pos_];
      const size_t start = pos_;
      if (is_digit(c)) {
        const size_t fe = match_float(s_, pos_);
        if (fe != std::string_view::npos) {
          std::string digits;
          for (size_t i = pos_; i < fe; ++i) {
            if (s_[i] != '_') digits.push_back(s_[i]);
          }
          Token t{TokenType::kFloat, std::string(s_.substr(pos_, fe - pos_)), 0, 0, start};
          t.float_value = std::strtod(digits.c_str(), nullptr);  // overflow gives inf, as Python
          tokens_.push_back(std::move(t));
          pos_ = fe;
          continue;
        }
        int64_t v = 0;
        bool overflow = false;
        const size_t ie = match_integer(s_, pos_, &v, &overflow);
        if (ie != std::string_view::npos) {
          if (overflow) lex_fail("integer literal does not fit in 64 bits", start);
          Token t{TokenType::kInteger, std::string(s_.substr(pos_, ie - pos_)), v, 0, start};
          tokens_.push_back(std::move(t));
          pos_ = ie;
          continue;
        }
      }
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < s_.size() && is_name_char(s_[e])) ++e;
        tokens_.push_back({TokenType::kName, std::string(s_.substr(pos_, e - pos_)), 0, 0, start});
        pos_ = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
        if (e >= s_.size()) lex_fail(std::string("unexpected char '") + c + "' (unterminated string)", start);
        tokens_.push_back({TokenType::kString, decode_string(s_.substr(pos_ + 1, e - pos_ - 1), start), 0, 0, start});
        pos_ = e + 1;
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~",
                                         "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
      std::string op;
      for (const char* o : kOps) {
        if (s_.compare(pos_, std::char_traits<char>::length(o), o) == 0) {
          op = o;
          break;
        }
      }
      if (op.empty()) {
        lex_fail(static_cast<unsigned char>(c) < 0x80 ? std::string("unexpected char '") + c + "'"
                                                      : std::string("unexpected non-ASCII character in tag"),
                 start);
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) lex_fail("unexpected '" + op + "'", start);
        if (balance.back() != op[0]) lex_fail("unexpected '" + op + "', expected '" + balance.back() + "'", start);
        balance.pop_back();
      }
      tokens_.push_back({TokenType::kOperator, op, 0, 0, start});
      pos_ += op.size();
    }
  }

  std::string_view s_;
  LexOptions opts_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace pagellm::jinja
