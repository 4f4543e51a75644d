#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>

namespace pagellm::tok {

namespace {

// Unicode White_Space, as class items (no brackets).
constexpr const char* kSpaceItems =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* c) const { pcre2_match_context_free(c); }
};

// Per-thread matching state: a JIT stack large enough for long runs of a repeated class, and a
// match context using it. Shared by every Regex on the thread.
struct ThreadMatchState {
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack{pcre2_jit_stack_create(64 * 1024, 8 << 20, nullptr)};
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context{pcre2_match_context_create(nullptr)};
  ThreadMatchState() {
    if (context && jit_stack) pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

std::string rewrite_whitespace_classes(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out += kSpaceItems;
        } else {
          out += "[";
          out += kSpaceItems;
          out += "]";
        }
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^";
        out += kSpaceItems;
        out += "]";
        ++i;
        continue;
      }
      out += c;
      out += n;
      ++i;
      // \Q...\E and \x{...} carry no brackets that matter here; \p{..} neither.
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:alpha:] inside a bracket expression.
      const size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

Result<Regex> Regex::compile(const std::string& pattern, const std::string& what) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument(what + ": cannot compile regex '" + pattern + "': " + reinterpret_cast<char*>(buf));
  }
  Regex r;
  r.impl_ = std::make_unique<Impl>();
  r.impl_->code = code;
  r.impl_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  r.pattern_ = pattern;
  return r;
}

Result<Regex> Regex::literal(const std::string& lit, const std::string& what) {
  std::string quoted;
  for (char c : lit) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) {
      char buf[12];
      std::snprintf(buf, sizeof(buf), "\\x{%x}", u);
      quoted += buf;
    } else {
      quoted += c;
    }
  }
  return compile(quoted, what);
}

Status Regex::find_all(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const {
  ThreadMatchState& ts = thread_state();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(impl_->code, nullptr));
  if (!md) return resource_exhausted("regex: out of memory");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t pos = 0;
  while (pos <= n) {
    const int rc = impl_->jit
                       ? pcre2_jit_match(impl_->code, s, n, pos, 0, md.get(), ts.context.get())
                       : pcre2_match(impl_->code, s, n, pos, PCRE2_NO_UTF_CHECK, md.get(), ts.context.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      return resource_exhausted("regex '" + pattern_ + "': matching failed: " + reinterpret_cast<char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    on_match(start, end);
    if (end > start) {
      pos = end;
    } else {
      // Empty match: step over one character, as Oniguruma's iterator does.
      if (end >= n) break;
      pos = end + 1;
      while (pos < n && (subject[pos] & 0xC0) == 0x80) ++pos;
    }
  }
  return Status();
}

}  // namespace pagellm::tok
