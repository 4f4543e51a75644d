#include "tokenizer/components.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <optional>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace pagellm::tok {

using nlohmann::json;

namespace {

std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// Reads an optional field with a default; a field of the wrong type is an error.
template <typename T>
Result<T> field(const json& j, const char* key, T def, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return invalid_argument(where + ": field '" + key + "' has the wrong type");
  }
}

// A Split/Replace "pattern": {"String": s} or {"Regex": r}.
Result<Regex> make_pattern(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_argument(where + ": 'pattern' must be an object");
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    return Regex::literal(it->get<std::string>(), where);
  }
  if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
    return Regex::compile(it->get<std::string>(), where);
  }
  return invalid_argument(where + ": 'pattern' must hold 'String' or 'Regex'");
}

// Replaces every match of `re` in `*s` with `content`.
Status regex_replace(const Regex& re, const std::string& content, std::string* s) {
  std::string out;
  size_t last = 0;
  bool any = false;
  PAGELLM_RETURN_IF_ERROR(re.find_all(*s, [&](size_t a, size_t b) {
    if (b == a) return;  // tokenizers skips empty matches when replacing
    any = true;
    out.append(*s, last, a - last);
    out += content;
    last = b;
  }));
  if (!any) return Status();
  out.append(*s, last, std::string::npos);
  *s = std::move(out);
  return Status();
}

// ------------------------------------------------------------------------------------------------
// Normalizers

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  Status normalize(std::string* text) const override {
    if (text->empty()) return Status();
    // Pure ASCII is invariant under every normalization form.
    bool ascii = true;
    for (char c : *text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return Status();
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                                            static_cast<utf8proc_ssize_t>(text->size()), &out,
                                            static_cast<utf8proc_option_t>(options_ | UTF8PROC_STABLE));
    if (n < 0) return invalid_argument(std::string("normalizer: ") + utf8proc_errmsg(n));
    text->assign(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return Status();
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t pos = 0;
    while (pos < text->size()) append_lowercase(&out, next_code_point(*text, &pos));
    *text = std::move(out);
    return Status();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t p = begin;
        if (!is_whitespace(next_code_point(*text, &p))) break;
        begin = p;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t p = start;
        if (!is_whitespace(next_code_point(*text, &p))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status();
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  Status normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t pos = 0;
    while (pos < text->size()) {
      const char32_t c = next_code_point(*text, &pos);
      if (!is_nonspacing_mark(c)) append_utf8(&out, c);
    }
    *text = std::move(out);
    return Status();
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  Status normalize(std::string* text) const override { return regex_replace(re_, content_, text); }

 private:
  Regex re_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  Status normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prepend_);
    return Status();
  }

 private:
  std::string prepend_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> s) : steps_(std::move(s)) {}
  Status normalize(std::string* text) const override {
    for (const auto& s : steps_) PAGELLM_RETURN_IF_ERROR(s->normalize(text));
    return Status();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// ------------------------------------------------------------------------------------------------
// Pre-tokenizers

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Result<SplitBehavior> parse_behavior(const json& j, const std::string& where) {
  if (!j.is_string()) return invalid_argument(where + ": 'behavior' must be a string");
  const std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(where + ": unknown behavior '" + b + "'");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// tokenizers' NormalizedString::split: turns (span, is_match) events into pieces per behaviour.
void split_piece(const Piece& piece, std::vector<Span> spans, SplitBehavior behavior, std::vector<Piece>* out) {
  std::vector<Span> res;  // is_match here means "remove"
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto s : spans) res.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      res = std::move(spans);
      break;
    case SplitBehavior::kContiguous: {
      bool prev = false;
      for (const auto& s : spans) {
        if (s.is_match == prev && !res.empty()) {
          res.back().end = s.end;
        } else {
          res.push_back({s.begin, s.end, false});
        }
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev = false;
      for (const auto& s : spans) {
        if (s.is_match && !prev && !res.empty()) {
          res.back().end = s.end;
        } else {
          res.push_back({s.begin, s.end, false});
        }
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !prev && !res.empty()) {
          res.back().begin = it->begin;
        } else {
          res.push_back({it->begin, it->end, false});
        }
        prev = it->is_match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (const auto& s : res) {
    if (s.is_match || s.end <= s.begin) continue;
    out->push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_origin && s.begin == 0});
  }
}

// Match events of a regex over a piece (tokenizers' Pattern::find_matches for a regex).
Status regex_spans(const Regex& re, const std::string& text, bool invert, std::vector<Span>* spans) {
  spans->clear();
  if (text.empty()) {
    spans->push_back({0, 0, false});
    return Status();
  }
  size_t prev = 0;
  PAGELLM_RETURN_IF_ERROR(re.find_all(text, [&](size_t a, size_t b) {
    if (prev != a) spans->push_back({prev, a, invert});
    spans->push_back({a, b, !invert});
    prev = b;
  }));
  if (prev != text.size()) spans->push_back({prev, text.size(), invert});
  return Status();
}

// Match events of a character predicate: every matching character is its own match.
template <typename Pred>
void char_spans(const std::string& text, Pred pred, std::vector<Span>* spans) {
  spans->clear();
  if (text.empty()) {
    spans->push_back({0, 0, false});
    return;
  }
  size_t last = 0, pos = 0;
  while (pos < text.size()) {
    const size_t b = pos;
    const char32_t c = next_code_point(text, &pos);
    if (pred(c)) {
      if (last < b) spans->push_back({last, b, false});
      spans->push_back({b, pos, true});
      last = pos;
    }
  }
  if (last < text.size()) spans->push_back({last, text.size(), false});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, SplitBehavior b, bool invert) : re_(std::move(re)), behavior_(b), invert_(invert) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<Span> spans;
    for (const auto& p : *pieces) {
      PAGELLM_RETURN_IF_ERROR(regex_spans(re_, p.text, invert_, &spans));
      split_piece(p, spans, behavior_, &out);
    }
    *pieces = std::move(out);
    return Status();
  }

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

template <typename Pred>
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(Pred pred, SplitBehavior b) : pred_(pred), behavior_(b) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<Span> spans;
    for (const auto& p : *pieces) {
      char_spans(p.text, pred_, &spans);
      split_piece(p, spans, behavior_, &out);
    }
    *pieces = std::move(out);
    return Status();
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
};

template <typename Pred>
std::unique_ptr<PreTokenizer> make_char_split(Pred pred, SplitBehavior b) {
  return std::make_unique<CharSplitPreTokenizer<Pred>>(pred, b);
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> split;
    std::vector<Span> spans;
    for (auto& p : *pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (re_) {
        PAGELLM_RETURN_IF_ERROR(regex_spans(*re_, p.text, false, &spans));
        split_piece(p, spans, SplitBehavior::kIsolated, &split);
      } else if (!p.text.empty()) {
        split.push_back(std::move(p));
      }
    }
    for (auto& p : split) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) mapped += byte_level_char(static_cast<unsigned char>(c));
      p.text = std::move(mapped);
    }
    *pieces = std::move(split);
    return Status();
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> re_;
};

enum class PrependScheme { kAlways, kNever, kFirst };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<Span> spans;
    for (auto& p : *pieces) {
      std::string t;
      t.reserve(p.text.size() + rep_.size());
      for (char c : p.text) {
        if (c == ' ') {
          t += rep_;
        } else {
          t += c;
        }
      }
      const bool starts = t.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        t.insert(0, rep_);
      }
      Piece np{std::move(t), p.at_origin};
      if (!split_) {
        if (!np.text.empty()) out.push_back(std::move(np));
        continue;
      }
      spans.clear();
      size_t last = 0, pos = 0;
      while ((pos = np.text.find(rep_, pos)) != std::string::npos) {
        if (last < pos) spans.push_back({last, pos, false});
        spans.push_back({pos, pos + rep_.size(), true});
        pos += rep_.size();
        last = pos;
      }
      if (last < np.text.size() || np.text.empty()) spans.push_back({last, np.text.size(), false});
      split_piece(np, spans, SplitBehavior::kMergedWithNext, &out);
    }
    *pieces = std::move(out);
    return Status();
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> s) : steps_(std::move(s)) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    for (const auto& s : steps_) PAGELLM_RETURN_IF_ERROR(s->pre_tokenize(pieces));
    return Status();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Result<PrependScheme> parse_prepend_scheme(const json& j, const std::string& where) {
  if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "never") return PrependScheme::kNever;
    if (s == "first") return PrependScheme::kFirst;
    return invalid_argument(where + ": unknown prepend_scheme '" + s + "'");
  }
  // Older files: add_prefix_space (default true) instead of prepend_scheme.
  PAGELLM_ASSIGN_OR_RETURN(bool add, field<bool>(j, "add_prefix_space", true, where));
  return add ? PrependScheme::kAlways : PrependScheme::kNever;
}

Result<std::string> single_char(const json& j, const char* key, const std::string& def, const std::string& where) {
  PAGELLM_ASSIGN_OR_RETURN(std::string s, field<std::string>(j, key, def, where));
  size_t pos = 0;
  if (s.empty() || !is_valid_utf8(s) || (next_code_point(s, &pos), pos != s.size())) {
    return invalid_argument(where + ": '" + key + "' must be a single character");
  }
  return s;
}

// ------------------------------------------------------------------------------------------------
// Decoders

class ByteLevelDecoder final : public Decoder {
 public:
  TokenSpelling spelling() const override { return TokenSpelling::kByteLevel; }
  Status decode_chain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const auto& t : *tokens) {
      const size_t mark = bytes.size();
      bool all = true;
      size_t pos = 0;
      while (pos < t.size()) {
        const int b = byte_level_byte(next_code_point(t, &pos));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens->assign(1, utf8_lossy(bytes));
    return Status();
  }
};

}  // namespace

// "<0xNN>" as Rust's u8::from_str_radix(&t[3..5], 16) reads it (a leading '+' is accepted).
std::optional<unsigned char> byte_fallback_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') {
    const int d = hex(t[4]);
    if (d < 0) return std::nullopt;
    return static_cast<unsigned char>(d);
  }
  const int h = hex(t[3]), l = hex(t[4]);
  if (h < 0 || l < 0) return std::nullopt;
  return static_cast<unsigned char>(h * 16 + l);
}

namespace {

class ByteFallbackDecoder final : public Decoder {
 public:
  Status decode_chain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&]() {
      if (run_len == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_len; ++i) out.push_back(to_utf8(kReplacementChar));
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : *tokens) {
      if (auto b = byte_fallback_value(t)) {
        run.push_back(static_cast<char>(*b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
    return Status();
  }
  bool has_byte_fallback() const override { return true; }
  TokenSpelling spelling() const override { return TokenSpelling::kByteFallback; }
};

class FuseDecoder final : public Decoder {
 public:
  Status decode_chain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
    return Status();
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  Status decode_chain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::vector<size_t> offs;  // byte offset of each character, plus the end
      size_t pos = 0;
      std::vector<char32_t> chars;
      while (pos < t.size()) {
        offs.push_back(pos);
        chars.push_back(next_code_point(t, &pos));
      }
      offs.push_back(t.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (chars[i] != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t idx = chars.size() - i - 1;
        if (chars[idx] != content_) break;
        stop_cut = idx;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      t = t.substr(offs[start_cut], offs[stop_cut] - offs[start_cut]);
    }
    return Status();
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex re, std::string content, bool metaspace)
      : re_(std::move(re)), content_(std::move(content)), metaspace_(metaspace) {}
  Status decode_chain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) PAGELLM_RETURN_IF_ERROR(regex_replace(re_, content_, &t));
    return Status();
  }
  // Replacing U+2581 by a space is how SentencePiece vocabularies spell spaces.
  TokenSpelling spelling() const override {
    return metaspace_ ? TokenSpelling::kByteFallback : TokenSpelling::kRaw;
  }

 private:
  Regex re_;
  std::string content_;
  bool metaspace_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, PrependScheme scheme) : rep_(std::move(rep)), scheme_(scheme) {}
  TokenSpelling spelling() const override { return TokenSpelling::kByteFallback; }
  Status decode_chain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string out;
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, rep_.size(), rep_) == 0) {
          // tokenizers drops every replacement character of the first token unless prepending is off.
          if (!(i == 0 && scheme_ != PrependScheme::kNever)) out += ' ';
          pos += rep_.size();
        } else {
          const size_t b = pos;
          next_code_point(t, &pos);
          out.append(t, b, pos - b);
        }
      }
      t = std::move(out);
    }
    return Status();
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> s) : steps_(std::move(s)) {}
  Status decode_chain(std::vector<std::string>* tokens) const override {
    for (const auto& s : steps_) PAGELLM_RETURN_IF_ERROR(s->decode_chain(tokens));
    return Status();
  }
  bool has_byte_fallback() const override {
    for (const auto& s : steps_) {
      if (s->has_byte_fallback()) return true;
    }
    return false;
  }
  // ByteLevel wins (GGUF's byte-level vocabularies also list a ByteFallback step, which never
  // fires on them), then SentencePiece's spelling.
  TokenSpelling spelling() const override {
    TokenSpelling best = TokenSpelling::kRaw;
    for (const auto& s : steps_) {
      const TokenSpelling t = s->spelling();
      if (t == TokenSpelling::kByteLevel) return t;
      if (t == TokenSpelling::kByteFallback) best = t;
    }
    return best;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

// --------------------------------------------------------------------------------------------------

const std::string& byte_level_char(unsigned char b) {
  static const std::array<std::string, 256> kTable = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      // Printable bytes stand for themselves; the others get code points from U+0100 up, in order.
      t[i] = to_utf8(printable ? static_cast<char32_t>(i) : static_cast<char32_t>(256 + n++));
    }
    return t;
  }();
  return kTable[b];
}

int byte_level_byte(char32_t c) {
  static const std::array<int16_t, 512> kInverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      const char32_t cp = next_code_point(byte_level_char(static_cast<unsigned char>(b)), &pos);
      inv[cp] = static_cast<int16_t>(b);
    }
    return inv;
  }();
  return c < 512 ? kInverse[c] : -1;
}

Result<std::unique_ptr<Normalizer>> make_normalizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  const std::string t = type_of(j);
  const std::string where = "normalizer " + (t.empty() ? std::string("(no type)") : t);
  if (t == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_COMPOSE));
  if (t == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_DECOMPOSE));
  if (t == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (t == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (t == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (t == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (t == "Strip") {
    PAGELLM_ASSIGN_OR_RETURN(bool l, field<bool>(j, "strip_left", true, where));
    PAGELLM_ASSIGN_OR_RETURN(bool r, field<bool>(j, "strip_right", true, where));
    return std::unique_ptr<Normalizer>(new StripNormalizer(l, r));
  }
  if (t == "Replace") {
    if (!j.contains("pattern")) return invalid_argument(where + ": missing 'pattern'");
    PAGELLM_ASSIGN_OR_RETURN(Regex re, make_pattern(j["pattern"], where));
    PAGELLM_ASSIGN_OR_RETURN(std::string content, field<std::string>(j, "content", "", where));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), std::move(content)));
  }
  if (t == "Prepend") {
    PAGELLM_ASSIGN_OR_RETURN(std::string p, field<std::string>(j, "prepend", "", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (t == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return invalid_argument(where + ": 'normalizers' must be a list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& e : *it) {
      PAGELLM_ASSIGN_OR_RETURN(auto n, make_normalizer(e));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return unimplemented("tokenizer.json: normalizer type '" + t + "' is not supported");
}

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  const std::string t = type_of(j);
  const std::string where = "pre_tokenizer " + (t.empty() ? std::string("(no type)") : t);
  if (t == "Split") {
    if (!j.contains("pattern")) return invalid_argument(where + ": missing 'pattern'");
    PAGELLM_ASSIGN_OR_RETURN(Regex re, make_pattern(j["pattern"], where));
    if (!j.contains("behavior")) return invalid_argument(where + ": missing 'behavior'");
    PAGELLM_ASSIGN_OR_RETURN(SplitBehavior b, parse_behavior(j["behavior"], where));
    PAGELLM_ASSIGN_OR_RETURN(bool invert, field<bool>(j, "invert", false, where));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), b, invert));
  }
  if (t == "ByteLevel") {
    PAGELLM_ASSIGN_OR_RETURN(bool aps, field<bool>(j, "add_prefix_space", true, where));
    PAGELLM_ASSIGN_OR_RETURN(bool use_regex, field<bool>(j, "use_regex", true, where));
    std::optional<Regex> re;
    if (use_regex) {
      PAGELLM_ASSIGN_OR_RETURN(Regex r, Regex::compile(kGpt2Pattern, where));
      re = std::move(r);
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(aps, std::move(re)));
  }
  if (t == "Metaspace") {
    PAGELLM_ASSIGN_OR_RETURN(std::string rep, single_char(j, "replacement", "\xE2\x96\x81", where));
    PAGELLM_ASSIGN_OR_RETURN(PrependScheme scheme, parse_prepend_scheme(j, where));
    PAGELLM_ASSIGN_OR_RETURN(bool split, field<bool>(j, "split", true, where));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(rep), scheme, split));
  }
  if (t == "Digits") {
    PAGELLM_ASSIGN_OR_RETURN(bool individual, field<bool>(j, "individual_digits", false, where));
    return make_char_split([](char32_t c) { return is_numeric(c); },
                           individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (t == "Punctuation") {
    SplitBehavior b = SplitBehavior::kIsolated;
    if (auto it = j.find("behavior"); it != j.end() && !it->is_null()) {
      PAGELLM_ASSIGN_OR_RETURN(b, parse_behavior(*it, where));
    }
    return make_char_split([](char32_t c) { return is_punctuation(c); }, b);
  }
  if (t == "WhitespaceSplit") {
    return make_char_split([](char32_t c) { return is_whitespace(c); }, SplitBehavior::kRemoved);
  }
  if (t == "Whitespace") {
    PAGELLM_ASSIGN_OR_RETURN(Regex re, Regex::compile("\\w+|[^\\w\\s]+", where));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), SplitBehavior::kRemoved, true));
  }
  if (t == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return invalid_argument(where + ": 'pretokenizers' must be a list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& e : *it) {
      PAGELLM_ASSIGN_OR_RETURN(auto p, make_pre_tokenizer(e));
      if (p) steps.push_back(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  return unimplemented("tokenizer.json: pre_tokenizer type '" + t + "' is not supported");
}

Result<std::unique_ptr<Decoder>> make_decoder(const json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  const std::string t = type_of(j);
  const std::string where = "decoder " + (t.empty() ? std::string("(no type)") : t);
  if (t == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (t == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (t == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (t == "Strip") {
    PAGELLM_ASSIGN_OR_RETURN(std::string c, single_char(j, "content", " ", where));
    PAGELLM_ASSIGN_OR_RETURN(int64_t start, field<int64_t>(j, "start", 0, where));
    PAGELLM_ASSIGN_OR_RETURN(int64_t stop, field<int64_t>(j, "stop", 0, where));
    if (start < 0 || stop < 0) return invalid_argument(where + ": 'start'/'stop' must not be negative");
    size_t pos = 0;
    return std::unique_ptr<Decoder>(
        new StripDecoder(next_code_point(c, &pos), static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (t == "Replace") {
    if (!j.contains("pattern")) return invalid_argument(where + ": missing 'pattern'");
    PAGELLM_ASSIGN_OR_RETURN(Regex re, make_pattern(j["pattern"], where));
    PAGELLM_ASSIGN_OR_RETURN(std::string content, field<std::string>(j, "content", "", where));
    const bool metaspace = j["pattern"].value("String", "") == "\xE2\x96\x81" && content == " ";
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder(std::move(re), std::move(content), metaspace));
  }
  if (t == "Metaspace") {
    PAGELLM_ASSIGN_OR_RETURN(std::string rep, single_char(j, "replacement", "\xE2\x96\x81", where));
    PAGELLM_ASSIGN_OR_RETURN(PrependScheme scheme, parse_prepend_scheme(j, where));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(rep), scheme));
  }
  if (t == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return invalid_argument(where + ": 'decoders' must be a list");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& e : *it) {
      PAGELLM_ASSIGN_OR_RETURN(auto d, make_decoder(e));
      if (d) steps.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  return unimplemented("tokenizer.json: decoder type '" + t + "' is not supported");
}

namespace {

// A ["token", id] pair of RobertaProcessing/BertProcessing.
Result<int32_t> pair_id(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return invalid_argument(where + ": '" + key + "' must be [token, id]");
  }
  return (*it)[1].get<int32_t>();
}

}  // namespace

Result<PostTemplate> make_post_template(const json& j) {
  PostTemplate tpl;
  if (j.is_null()) return tpl;
  const std::string t = type_of(j);
  const std::string where = "post_processor " + (t.empty() ? std::string("(no type)") : t);
  if (t == "ByteLevel") return tpl;  // it only trims offsets
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    PAGELLM_ASSIGN_OR_RETURN(int32_t cls, pair_id(j, "cls", where));
    PAGELLM_ASSIGN_OR_RETURN(int32_t sep, pair_id(j, "sep", where));
    tpl.prefix = {cls};
    tpl.suffix = {sep};
    return tpl;
  }
  if (t == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) return invalid_argument(where + ": 'single' must be a list");
    const json* specials = j.contains("special_tokens") ? &j["special_tokens"] : nullptr;
    bool seen_sequence = false;
    for (const auto& piece : *single) {
      if (piece.contains("Sequence")) {
        if (seen_sequence) return invalid_argument(where + ": 'single' names the sequence twice");
        seen_sequence = true;
        continue;
      }
      auto sp = piece.find("SpecialToken");
      if (sp == piece.end() || !sp->contains("id") || !(*sp)["id"].is_string()) {
        return invalid_argument(where + ": a 'single' item must be a Sequence or a SpecialToken");
      }
      const std::string name = (*sp)["id"].get<std::string>();
      if (!specials || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return invalid_argument(where + ": special token '" + name + "' is not in 'special_tokens'");
      }
      for (const auto& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer()) return invalid_argument(where + ": ids of '" + name + "' must be integers");
        (seen_sequence ? tpl.suffix : tpl.prefix).push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) return invalid_argument(where + ": 'single' has no $A sequence");
    return tpl;
  }
  if (t == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) return invalid_argument(where + ": 'processors' must be a list");
    for (const auto& e : *it) {
      PAGELLM_ASSIGN_OR_RETURN(PostTemplate inner, make_post_template(e));
      // Each processor wraps what the previous ones produced.
      inner.prefix.insert(inner.prefix.end(), tpl.prefix.begin(), tpl.prefix.end());
      tpl.suffix.insert(tpl.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      tpl.prefix = std::move(inner.prefix);
    }
    return tpl;
  }
  return unimplemented("tokenizer.json: post_processor type '" + t + "' is not supported");
}

}  // namespace pagellm::tok
