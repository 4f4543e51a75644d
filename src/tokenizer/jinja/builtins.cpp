// Builtin filters, tests, global functions and the str/dict/list methods templates call, each
// matching what jinja2 3.1 (with transformers' tojson, raise_exception and strftime_now, in its
// immutable sandbox) returns.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>

#include "tokenizer/jinja/interpreter.h"

namespace pagellm::jinja {

// ---- argument binding ------------------------------------------------------------------------

Params::Params(const char* func, CallArgs& args, std::initializer_list<const char*> names)
    : values_(names.size()), set_(names.size(), false) {
  std::vector<const char*> n(names);
  if (args.pos.size() > n.size()) {
    fail(std::string(func) + "() takes at most " + std::to_string(n.size()) + " argument(s) (" +
         std::to_string(args.pos.size()) + " given)");
  }
  for (size_t i = 0; i < args.pos.size(); ++i) {
    values_[i] = std::move(args.pos[i]);
    set_[i] = true;
  }
  for (auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < n.size() && k != n[i]) ++i;
    if (i == n.size()) fail(std::string(func) + "() got an unexpected keyword argument '" + k + "'");
    if (set_[i]) fail(std::string(func) + "() got multiple values for argument '" + k + "'");
    values_[i] = std::move(v);
    set_[i] = true;
  }
}

int64_t to_int_arg(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_undefined()) fail(v.undefined_hint());
  fail(std::string(what) + ": '" + v.type_name() + "' object cannot be interpreted as an integer");
}

namespace {

std::string soft_str(const Value& v) { return py_str(v); }

const std::string& need_str(const Value& v, const char* what) {
  if (v.is_undefined()) fail(v.undefined_hint());
  if (!v.is_string()) fail(std::string(what) + " must be str, not " + v.type_name());
  return v.str();
}

// ---- Unicode case and classes ----

bool is_cased(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
bool is_lower_cp(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_LL; }
bool is_upper_cp(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT;
}
bool is_alpha_cp(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool is_numeric_cp(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}
bool is_digit_cp(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ND;
}
char32_t to_upper_cp(char32_t cp) { return cp >= 0xDC80 && cp <= 0xDCFF ? cp : utf8proc_toupper(cp); }
char32_t to_lower_cp(char32_t cp) { return cp >= 0xDC80 && cp <= 0xDCFF ? cp : utf8proc_tolower(cp); }
char32_t to_title_cp(char32_t cp) { return cp >= 0xDC80 && cp <= 0xDCFF ? cp : utf8proc_totitle(cp); }

// Multi-code-point case mappings (Unicode SpecialCasing), sorted by code point.
struct SpecialCase {
  char32_t cp;
  const char32_t* upper;
  const char32_t* lower;
  const char32_t* title;
};
const SpecialCase kSpecialCasing[] = {
#include "tokenizer/jinja/special_casing.inc"
};

const SpecialCase* find_special(char32_t cp) {
  const auto* end = std::end(kSpecialCasing);
  const auto* it = std::lower_bound(std::begin(kSpecialCasing), end, cp,
                                    [](const SpecialCase& c, char32_t x) { return c.cp < x; });
  return it != end && it->cp == cp ? it : nullptr;
}

enum class Case { kUpper, kLower, kTitle };

void append_case(std::u32string& out, char32_t cp, Case c) {
  if (const SpecialCase* sc = find_special(cp)) {
    out += c == Case::kUpper ? sc->upper : c == Case::kLower ? sc->lower : sc->title;
    return;
  }
  out.push_back(c == Case::kUpper ? to_upper_cp(cp) : c == Case::kLower ? to_lower_cp(cp) : to_title_cp(cp));
}

std::string map_case(std::string_view s, Case c) {
  std::u32string out;
  for (char32_t cp : utf8_decode(s)) append_case(out, cp, c);
  return utf8_encode(out);
}

std::string py_capitalize(std::string_view s) {
  std::u32string u = utf8_decode(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) append_case(out, u[i], i == 0 ? Case::kTitle : Case::kLower);
  return utf8_encode(out);
}

std::string py_title(std::string_view s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    append_case(out, c, prev_cased ? Case::kLower : Case::kTitle);
    prev_cased = is_cased(c);
  }
  return utf8_encode(out);
}

// Python's str.islower / str.isupper: at least one cased character, none of the other case.
bool py_islower(std::string_view s) {
  bool any = false;
  for (char32_t c : utf8_decode(s)) {
    if (is_upper_cp(c)) return false;
    if (is_lower_cp(c)) any = true;
  }
  return any;
}
bool py_isupper(std::string_view s) {
  bool any = false;
  for (char32_t c : utf8_decode(s)) {
    if (is_lower_cp(c)) return false;
    if (is_upper_cp(c)) any = true;
  }
  return any;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::u32string> py_splitlines(const std::u32string& u, bool keepends) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size() && !is_line_break(u[j])) ++j;
    size_t eol = j;
    if (j < u.size()) {
      eol = (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n') ? j + 2 : j + 1;
    }
    out.push_back(u.substr(i, (keepends ? eol : j) - i));
    i = eol;
  }
  return out;
}

std::string py_strip(std::string_view s, const Value& chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_decode(need_str(chars, "strip arg"));
  auto strip_it = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0;
  size_t e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return utf8_encode(u.substr(b, e - b));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                       Interpreter& in) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement before every code point and at the end.
    std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (char32_t c : u) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      utf8_append(out, c);
      in.check_size(out.size());
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += repl;
    in.check_size(out.size());
    pos = f + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  in.check_size(out.size());
  return out;
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> v;
  v.reserve(parts.size());
  for (auto& p : parts) v.push_back(Value::string(std::move(p)));
  return Value::list(std::move(v));
}

// str.split / str.rsplit.
Value py_split(const std::string& s, const Value& sep_v, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep_v.is_none() || sep_v.is_undefined()) {
    std::u32string u = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    if (!from_right) {
      size_t i = 0;
      while (i < u.size()) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = u.size();
          while (e > i && py_isspace(u[e - 1])) --e;
          words.emplace_back(i, e);
          break;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = u.size();
      while (i > 0) {
        while (i > 0 && py_isspace(u[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t b = 0;
          while (b < i && py_isspace(u[b])) ++b;
          words.emplace_back(b, i);
          break;
        }
        size_t j = i;
        while (j > 0 && !py_isspace(u[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words) parts.push_back(utf8_encode(std::u32string_view(u).substr(b, e - b)));
    return str_list(std::move(parts));
  }
  const std::string& sep = need_str(sep_v, "separator");
  if (sep.empty()) fail("empty separator");
  if (!from_right) {
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t f = s.find(sep, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + sep.size();
      ++n;
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      if (end < sep.size()) break;
      const size_t f = s.rfind(sep, end - sep.size());
      if (f == std::string::npos) break;
      parts.push_back(s.substr(f + sep.size(), end - f - sep.size()));
      end = f;
      ++n;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return str_list(std::move(parts));
}

// Python's slice-style start/end arguments of find/count/startswith, in code points.
std::u32string sub_range(const std::u32string& u, const Params& p, size_t start_i, size_t end_i) {
  const auto n = static_cast<int64_t>(u.size());
  auto norm = [&](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    int64_t x = to_int_arg(v, "slice index");
    if (x < 0) x = std::max<int64_t>(0, x + n);
    return std::min(x, n);
  };
  const int64_t b = p.has(start_i) ? norm(p.get(start_i), 0) : 0;
  const int64_t e = p.has(end_i) ? norm(p.get(end_i), n) : n;
  if (b > e) return {};
  return u.substr(b, e - b);
}

// printf-style formatting: "fmt" % args.
std::string percent_format(const std::string& fmt, const Value& args, Interpreter& in) {
  std::vector<Value> pos;
  const bool mapping = args.is_dict();
  if (args.is_tuple()) pos = args.items();
  else if (!mapping) pos.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      const Value* v = args.dict_data().find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!v) fail(std::string("format key '").append(fmt, i + 1, close - i - 1) + "' not found");
      keyed = *v;
      arg = &keyed;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) spec.push_back(fmt[i++]);
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') spec.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      spec.push_back(fmt[i++]);
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') spec.push_back(fmt[i++]);
    }
    if (spec.size() > 12) fail("format width too large");
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!arg) {
      if (mapping && pos.empty()) fail("format requires a mapping");
      if (next >= pos.size()) fail("not enough arguments for format string");
      arg = &pos[next++];
    }
    char buf[512];
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? py_str(*arg) : py_repr(*arg);
        const std::string fmt_s = spec + "s";
        if (spec == "%") {
          out += s;
        } else {
          // Width and precision count code points in Python; pad by hand.
          std::u32string u = utf8_decode(s);
          const size_t dot = spec.find('.');
          if (dot != std::string::npos) u = u.substr(0, std::strtoul(spec.c_str() + dot + 1, nullptr, 10));
          const bool left = spec.find('-') != std::string::npos;
          size_t width = 0;
          for (size_t k = 1; k < spec.size() && spec[k] != '.'; ++k) {
            if (spec[k] >= '1' && spec[k] <= '9') {
              width = std::strtoul(spec.c_str() + k, nullptr, 10);
              break;
            }
          }
          std::string body = utf8_encode(u);
          const std::string pad(width > u.size() ? width - u.size() : 0, ' ');
          out += left ? body + pad : pad + body;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg->is_number()) fail(std::string("%") + conv + " format: a real number is required, not " + arg->type_name());
        const long long v = arg->is_float() ? static_cast<long long>(std::trunc(arg->as_float())) : arg->as_int();
        if (conv == 'c') {
          utf8_append(out, static_cast<char32_t>(v));
          break;
        }
        std::snprintf(buf, sizeof(buf), (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_number()) fail(std::string("must be real number, not ") + arg->type_name());
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg->as_float());
        out += buf;
        break;
      }
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
    in.check_size(out.size());
  }
  if (!mapping && next < pos.size()) fail("not all arguments converted during string formatting");
  return out;
}

// str.format with {} / {0} / {name} fields (no format specs or conversions).
std::string brace_format(const std::string& fmt, CallArgs& args, Interpreter& in) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) fail("format specs in str.format are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.pos.size()) fail("Replacement index " + std::to_string(auto_index) + " out of range");
      v = &args.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = std::strtoul(field.c_str(), nullptr, 10);
      if (k >= args.pos.size()) fail(std::string("Replacement index ").append(field) + " out of range");
      v = &args.pos[k];
    } else {
      for (auto& [name, val] : args.kw) {
        if (name == field) v = &val;
      }
      if (!v) fail(std::string("format key '").append(field) + "' not found");
    }
    out += py_str(*v);
    in.check_size(out.size());
    i = close;
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.str()));
    case Value::Kind::kList: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict_data().items.size());
    default: fail(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

bool hashable(const Value& v) {
  if (v.is_dict()) return false;
  if (v.is_list()) {
    if (!v.is_tuple()) return false;
    return std::all_of(v.items().begin(), v.items().end(), hashable);
  }
  return true;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py_lower(v.str())) : v; }

// make_attrgetter: "a.b.0" looks up item-then-attribute per part; digits are int indices.
Value get_path(Interpreter& in, Value item, const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return item;
  if (!attribute.is_string()) return in.get_item(item, attribute);
  const std::string& a = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = a.find('.', start);
    const std::string part = a.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && part.size() < 18) item = in.get_item(item, Value::integer(std::strtoll(part.c_str(), nullptr, 10)));
    else item = in.get_item(item, Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return item;
}

// Key function of sort/unique/min/max: one attribute path, or several comma-separated ones.
Value sort_key(Interpreter& in, const Value& item, const Value& attribute, bool case_sensitive) {
  if (attribute.is_string() && attribute.str().find(',') != std::string::npos) {
    std::vector<Value> keys;
    size_t start = 0;
    const std::string& a = attribute.str();
    while (true) {
      const size_t comma = a.find(',', start);
      Value k = get_path(in, item, Value::string(a.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      keys.push_back(case_sensitive ? k : ignore_case(k));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return Value::list(std::move(keys));
  }
  Value k = get_path(in, item, attribute);
  return case_sensitive ? k : ignore_case(k);
}

Value make_pairs(const Value& dict) {
  std::vector<Value> out;
  for (const auto& [k, v] : dict.dict_data().items) out.push_back(Value::list({k, v}, true));
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_filter(Interpreter& in, const Value& input, CallArgs& args, bool keep, bool by_attr) {
  std::vector<Value> out;
  if (!input.truthy()) return Value::list({});
  size_t off = 0;
  Value attr;
  if (by_attr) {
    if (args.pos.empty()) fail("Missing parameter for attribute name");
    attr = args.pos[0];
    off = 1;
  }
  std::string test;
  const bool has_test = args.pos.size() > off;
  if (has_test) test = need_str(args.pos[off], "test name");
  CallArgs test_args;
  for (size_t i = off + 1; i < args.pos.size(); ++i) test_args.pos.push_back(args.pos[i]);
  test_args.kw = args.kw;
  for (const Value& item : in.iterate(input)) {
    in.charge(1);
    Value x = by_attr ? get_path(in, item, attr) : item;
    bool r;
    if (has_test) {
      CallArgs a = test_args;
      r = in.apply_test(test, x, a);
    } else {
      r = x.truthy();
    }
    if (r == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value json_dumps_filter(const Value& input, CallArgs& args) {
  Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = p.has(0) && p.get(0).truthy();
  if (p.has(1) && !p.get(1).is_none()) {
    const Value& ind = p.get(1);
    o.has_indent = true;
    if (ind.is_string()) o.indent = ind.str();
    else o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(to_int_arg(ind, "indent"), 0, 1024)), ' ');
  }
  if (p.has(2) && !p.get(2).is_none()) {
    const Value& s = p.get(2);
    if (!s.is_list() || s.items().size() != 2 || !s.items()[0].is_string() || !s.items()[1].is_string()) {
      fail("tojson: separators must be a pair of strings");
    }
    o.has_separators = true;
    o.item_separator = s.items()[0].str();
    o.key_separator = s.items()[1].str();
  }
  o.sort_keys = p.has(3) && p.get(3).truthy();
  return Value::string(py_json_dumps(input, o));
}

// Python's int(str, base) for the int filter: optional sign, whitespace, underscores, prefixes.
bool parse_py_int(const std::string& s, int64_t base, int64_t* out) {
  std::u32string u = utf8_decode(s);
  size_t b = 0;
  size_t e = u.size();
  while (b < e && py_isspace(u[b])) ++b;
  while (e > b && py_isspace(u[e - 1])) --e;
  bool neg = false;
  if (b < e && (u[b] == '+' || u[b] == '-')) neg = u[b++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (e - b >= 2 && u[b] == '0') {
      const char32_t x = u[b + 1] | 0x20;
      const int64_t pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        b += 2;
        if (b < e && u[b] == '_') ++b;
      }
    }
    if (base == 0) base = 10;
  }
  if (b >= e) return false;
  unsigned __int128 v = 0;
  bool prev_us = true;
  for (size_t i = b; i < e; ++i) {
    const char32_t c = u[i];
    if (c == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    prev_us = false;
    int d = 99;
    if (c >= '0' && c <= '9') d = static_cast<int>(c - '0');
    else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') d = static_cast<int>((c | 0x20) - 'a' + 10);
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<unsigned __int128>(INT64_MAX)) return false;
  }
  if (prev_us) return false;
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

// Python's float(str).
bool parse_py_float(const std::string& s, double* out) {
  std::u32string u = utf8_decode(s);
  size_t b = 0;
  size_t e = u.size();
  while (b < e && py_isspace(u[b])) ++b;
  while (e > b && py_isspace(u[e - 1])) --e;
  std::string t;
  for (size_t i = b; i < e; ++i) {
    if (u[i] >= 0x80) return false;
    t.push_back(static_cast<char>(u[i]));
  }
  std::string lower = py_lower(t);
  std::string body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    *out = lower[0] == '-' ? -v : v;
    return true;
  }
  // Digits with single underscores between digits, '.', exponent.
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
        return false;
      }
      continue;
    }
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
    clean.push_back(c);
  }
  if (clean.empty() || clean.find_first_of("0123456789") == std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end && *end == 0;
}

Value round_value(const Value& v, int64_t precision, const std::string& method) {
  if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail(v.undefined_hint());
  if (!v.is_number()) fail(std::string("type ") + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value::integer(v.as_int());
      double p = std::pow(10.0, static_cast<double>(-precision));
      return Value::integer(static_cast<int64_t>(std::nearbyint(v.as_float() / p) * p));
    }
    const double x = v.as_float();
    if (!std::isfinite(x)) return Value::number(x);
    if (precision == 0) return Value::number(std::nearbyint(x));
    if (precision > 0) {
      if (precision > 300) return Value::number(x);
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);  // exact, half-even
      return Value::number(std::strtod(buf, nullptr));
    }
    if (precision < -308) return Value::number(0.0 * x);
    const double p = std::pow(10.0, static_cast<double>(-precision));
    return Value::number(std::nearbyint(x / p) * p);
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double y = method == "ceil" ? std::ceil(v.as_float() * p) : std::floor(v.as_float() * p);
  return Value::number(y / p);
}

std::string do_indent(const std::string& s_in, const Value& width, bool first, bool blank) {
  const std::string ind = width.is_string() ? width.str()
                                            : std::string(static_cast<size_t>(std::clamp<int64_t>(to_int_arg(width, "indent width"), 0, 1 << 16)), ' ');
  std::u32string u = utf8_decode(s_in);
  u.push_back('\n');
  std::vector<std::u32string> lines = py_splitlines(u, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += utf8_encode(lines[i]);
    }
  } else {
    rv = utf8_encode(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind + utf8_encode(lines[i]);
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

std::string py_center(const std::string& s, int64_t width, char32_t fill = ' ') {
  const auto len = static_cast<int64_t>(utf8_length(s));
  const int64_t marg = width - len;
  if (marg <= 0) return s;
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string f;
  utf8_append(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += f;
  return out;
}

// ---- filters ----

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  Params p("trim", a, {"chars"});
  return Value::string(py_strip(soft_str(v), p.get_or(0, Value::none()), true, true));
}
Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  Params p("length", a, {});
  return Value::integer(py_len(v));
}
Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  Params p("upper", a, {});
  return Value::string(py_upper(soft_str(v)));
}
Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  Params p("lower", a, {});
  return Value::string(py_lower(soft_str(v)));
}
Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  Params p("capitalize", a, {});
  return Value::string(py_capitalize(soft_str(v)));
}
Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  Params p("title", a, {});
  // Words begin after runs of [-\s({[<]; each chunk is item[0].upper() + item[1:].lower().
  std::u32string u = utf8_decode(soft_str(v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::u32string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    const bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    for (size_t k = i; k < j; ++k) append_case(out, u[k], k == i ? Case::kUpper : Case::kLower);
    i = j;
  }
  return Value::string(utf8_encode(out));
}
Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("replace", a, {"old", "new", "count"});
  if (!p.has(0) || !p.has(1)) fail("replace() missing required argument");
  const int64_t count = p.has(2) && !p.get(2).is_none() ? to_int_arg(p.get(2), "count") : -1;
  return Value::string(py_replace(soft_str(v), soft_str(p.get(0)), soft_str(p.get(1)), count, in));
}
Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Params p("default", a, {"default_value", "boolean"});
  const bool boolean = p.has(1) && p.get(1).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return p.get_or(0, Value::string(""));
  return v;
}
Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  Params p("string", a, {});
  return v.is_string() ? v : Value::string(soft_str(v));
}
Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Params p("int", a, {"default", "base"});
  const Value def = p.get_or(0, Value::integer(0));
  const int64_t base = p.has(1) ? to_int_arg(p.get(1), "base") : 10;
  if (v.is_undefined()) fail(v.undefined_hint());
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double f = v.as_float();
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return def;
    return Value::integer(static_cast<int64_t>(std::trunc(f)));
  }
  if (v.is_string()) {
    int64_t x;
    if ((base == 0 || (base >= 2 && base <= 36)) && parse_py_int(v.str(), base, &x)) return Value::integer(x);
    double f;
    if (parse_py_float(v.str(), &f) && std::isfinite(f) && std::fabs(f) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(std::trunc(f)));
    }
  }
  return def;
}
Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Params p("float", a, {"default"});
  if (v.is_undefined()) fail(v.undefined_hint());
  if (v.is_number()) return Value::number(v.as_float());
  double f;
  if (v.is_string() && parse_py_float(v.str(), &f)) return Value::number(f);
  return p.get_or(0, Value::number(0.0));
}
Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  Params p("abs", a, {});
  if (v.is_undefined()) fail(v.undefined_hint());
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  fail(std::string("bad operand type for abs(): '") + v.type_name() + "'");
}
Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  Params p("round", a, {"precision", "method"});
  const int64_t precision = p.has(0) ? to_int_arg(p.get(0), "precision") : 0;
  const std::string method = p.has(1) ? soft_str(p.get(1)) : "common";
  return round_value(v, precision, method);
}
Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  Params p("safe", a, {});
  return v.is_string() ? v : Value::string(soft_str(v));
}
Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  Params p("escape", a, {});
  return Value::string(html_escape(soft_str(v)));
}
Value f_tojson(Interpreter&, const Value& v, CallArgs& a) { return json_dumps_filter(v, a); }
Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  Params p("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  return make_pairs(v);
}
Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("list", a, {});
  return Value::list(in.iterate(v));
}
Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("first", a, {});
  if (v.is_list()) return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items()[0];
  std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}
Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("last", a, {});
  if (v.is_undefined()) fail(v.undefined_hint());  // reversed(Undefined) is a TypeError
  std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}
Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("join", a, {"d", "attribute"});
  const std::string sep = p.has(0) ? soft_str(p.get(0)) : "";
  const Value attr = p.get_or(1, Value::none());
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    in.charge(1);
    if (!first) out += sep;
    first = false;
    out += soft_str(attr.is_none() ? item : get_path(in, item, attr));
    in.check_size(out.size());
  }
  return Value::string(std::move(out));
}
Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(utf8_encode(u));
  }
  if (v.is_undefined()) fail(v.undefined_hint());
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}
Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = p.has(0) && p.get(0).truthy();
  const bool cs = p.has(1) && p.get(1).truthy();
  const Value attr = p.get_or(2, Value::none());
  std::vector<Value> items = in.iterate(v);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(sort_key(in, items[i], attr, cs), i);
  in.charge(items.size() * 8 + 1);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, i] : keyed) out.push_back(items[i]);
  return Value::list(std::move(out));
}
Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
  const bool cs = p.has(0) && p.get(0).truthy();
  const std::string by = p.has(1) ? soft_str(p.get(1)) : "key";
  const bool reverse = p.has(2) && p.get(2).truthy();
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) fail(std::string("'") + v.type_name() + "' object has no attribute 'items'");
  std::vector<Value> pairs = make_pairs(v).items();
  const size_t idx = by == "key" ? 0 : 1;
  in.charge(pairs.size() * 8 + 1);
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = x.items()[idx];
    Value ky = y.items()[idx];
    if (!cs) {
      kx = ignore_case(kx);
      ky = ignore_case(ky);
    }
    return reverse ? py_less(ky, kx) : py_less(kx, ky);
  });
  return Value::list(std::move(pairs));
}
Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("unique", a, {"case_sensitive", "attribute"});
  const bool cs = p.has(0) && p.get(0).truthy();
  const Value attr = p.get_or(1, Value::none());
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : in.iterate(v)) {
    Value key = attr.is_none() ? item : get_path(in, item, attr);
    if (!cs) key = ignore_case(key);
    if (!hashable(key)) fail(std::string("unhashable type: '") + key.type_name() + "'");
    in.charge(seen.size() + 1);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}
Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool is_max) {
  Params p(is_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool cs = p.has(0) && p.get(0).truthy();
  const Value attr = p.get_or(1, Value::none());
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(in, items[0], attr, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], attr, cs);
    if (is_max ? py_less(best_key, k) : py_less(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("sum", a, {"attribute", "start"});
  const Value attr = p.get_or(0, Value::none());
  Value acc = p.get_or(1, Value::integer(0));
  for (const Value& item : in.iterate(v)) {
    Value x = attr.is_none() ? item : get_path(in, item, attr);
    if (!acc.is_number() || !x.is_number()) {
      fail(std::string("unsupported operand type(s) for +: '") + acc.type_name() + "' and '" + x.type_name() + "'");
    }
    if (acc.is_float() || x.is_float()) {
      acc = Value::number(acc.as_float() + x.as_float());
    } else {
      int64_t r;
      if (__builtin_add_overflow(acc.as_int(), x.as_int(), &r)) fail("integer overflow");
      acc = Value::integer(r);
    }
  }
  return acc;
}
Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("batch", a, {"linecount", "fill_with"});
  if (!p.has(0)) fail("batch() missing required argument 'linecount'");
  const int64_t n = to_int_arg(p.get(0), "linecount");
  const Value fill = p.get_or(1, Value::none());
  std::vector<Value> out;
  std::vector<Value> tmp;
  for (const Value& item : in.iterate(v)) {
    in.charge(1);
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (!fill.is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}
Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const bool by_attr = a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](const auto& kv) { return kv.first == "attribute"; });
  if (by_attr) {
    Params p("map", a, {"attribute", "default"});
    const Value def = p.get_or(1, Value::none());
    for (const Value& item : in.iterate(v)) {
      in.charge(1);
      Value x = get_path(in, item, p.get(0));
      if (!def.is_none() && x.is_undefined()) x = def;
      out.push_back(std::move(x));
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  const std::string name = need_str(a.pos[0], "map filter name");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& item : in.iterate(v)) {
    in.charge(1);
    CallArgs c = rest;
    out.push_back(in.apply_filter(name, item, c));
  }
  return Value::list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_filter(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_filter(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_filter(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_filter(in, v, a, false, true); }
Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("indent", a, {"width", "first", "blank"});
  const std::string s = do_indent(soft_str(v), p.get_or(0, Value::integer(4)), p.has(1) && p.get(1).truthy(),
                                  p.has(2) && p.get(2).truthy());
  in.check_size(s.size());
  return Value::string(s);
}
Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  Params p("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(soft_str(v))) {
    const bool w = c == '_' || is_alpha_cp(c) || is_numeric_cp(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}
Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("center", a, {"width"});
  const int64_t w = p.has(0) ? to_int_arg(p.get(0), "width") : 80;
  in.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)));
  return Value::string(py_center(soft_str(v), w));
}
Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  Params p("attr", a, {"name"});
  const std::string name = soft_str(p.get(0));
  if (v.is_object()) {
    const Value* x = v.object_data().find(name);
    if (x) return *x;
  }
  bool found = false;
  Value m = bound_method(in, v, name, &found);
  if (found) return m;
  return Value::undefined(std::string("'").append(v.type_name()) + " object' has no attribute '" + name + "'");
}
Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) fail("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    std::vector<std::pair<Value, Value>> kv;
    for (auto& [k, x] : a.kw) kv.emplace_back(Value::string(k), x);
    args = Value::dict(std::move(kv));
  } else {
    args = Value::list(a.pos, true);
  }
  return Value::string(percent_format(soft_str(v), args, in));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> kFilters = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
      {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent},     {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},           {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round},       {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},
      {"sum", f_sum},           {"title", f_title},       {"tojson", f_tojson},
      {"trim", f_trim},         {"unique", f_unique},     {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return kFilters;
}

// ---- tests ----

const Value& test_arg(const CallArgs& a, const char* name) {
  if (a.pos.empty()) fail(std::string("test '") + name + "' needs an argument");
  if (a.pos.size() > 1 || !a.kw.empty()) fail(std::string("test '") + name + "' takes one argument");
  return a.pos[0];
}
void no_args(const CallArgs& a, const char* name) {
  if (!a.pos.empty() || !a.kw.empty()) fail(std::string("test '") + name + "' takes no arguments");
}
Value py_mod(const Value& x, int64_t m) {
  if (x.is_undefined()) fail(x.undefined_hint());
  if (!x.is_number()) fail(std::string("unsupported operand type(s) for %: '") + x.type_name() + "' and 'int'");
  if (m == 0) fail("integer division or modulo by zero");
  if (x.is_float()) {
    double r = std::fmod(x.as_float(), static_cast<double>(m));
    if (r != 0 && ((r < 0) != (m < 0))) r += static_cast<double>(m);
    return Value::number(r);
  }
  if (m == -1) return Value::integer(0);
  int64_t r = x.as_int() % m;
  if (r != 0 && ((r < 0) != (m < 0))) r += m;
  return Value::integer(r);
}

bool t_defined(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "defined"); return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "undefined"); return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "none"); return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "boolean"); return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "true"); return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "false"); return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "integer"); return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "float"); return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "number"); return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "string"); return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "mapping"); return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "callable"); return v.is_callable(); }
bool t_escaped(Interpreter&, const Value&, CallArgs& a) { no_args(a, "escaped"); return false; }
bool t_lower(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "lower"); return py_islower(soft_str(v)); }
bool t_upper(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "upper"); return py_isupper(soft_str(v)); }
bool t_odd(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "odd");
  return py_equal(py_mod(v, 2), Value::integer(1));
}
bool t_even(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "even");
  return py_equal(py_mod(v, 2), Value::integer(0));
}
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const Value& n = test_arg(a, "divisibleby");
  return py_equal(py_mod(v, to_int_arg(n, "divisibleby")), Value::integer(0));
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return py_equal(v, test_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !py_equal(v, test_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return py_less(v, test_arg(a, "lt")); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return py_less(test_arg(a, "gt"), v); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "le");
  return py_less(v, o) || py_equal(v, o);
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "ge");
  return py_less(o, v) || py_equal(v, o);
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) { return v.identical(test_arg(a, "sameas")); }
bool t_in(Interpreter& in, const Value& v, CallArgs& a) {
  const Value& seq = test_arg(a, "in");
  CallArgs c;
  c.pos.push_back(v);
  // Reuse the `in` operator's semantics through a one-element compare.
  if (seq.is_string()) {
    if (!v.is_string()) fail(std::string("'in <string>' requires string as left operand, not ") + v.type_name());
    return seq.str().find(v.str()) != std::string::npos;
  }
  if (seq.is_undefined()) return false;
  if (seq.is_dict()) return seq.dict_data().find(v) != nullptr;
  if (seq.is_list()) {
    for (const Value& x : seq.items()) {
      if (py_equal(x, v)) return true;
    }
    return false;
  }
  (void)in;
  fail(std::string("argument of type '") + seq.type_name() + "' is not iterable");
}
bool t_filter(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "filter"); return v.is_string() && has_filter(v.str()); }
bool t_test(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "test"); return v.is_string() && has_test(v.str()); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> kTests = {
      {"odd", t_odd},         {"even", t_even},         {"divisibleby", t_divisibleby},
      {"defined", t_defined}, {"undefined", t_undefined}, {"filter", t_filter},
      {"test", t_test},       {"none", t_none},         {"boolean", t_boolean},
      {"false", t_false},     {"true", t_true},         {"integer", t_integer},
      {"float", t_float},     {"lower", t_lower},       {"upper", t_upper},
      {"string", t_string},   {"mapping", t_mapping},   {"number", t_number},
      {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
      {"sameas", t_sameas},   {"escaped", t_escaped},   {"in", t_in},
      {"==", t_eq},           {"eq", t_eq},             {"equalto", t_eq},
      {"!=", t_ne},           {"ne", t_ne},             {">", t_gt},
      {"gt", t_gt},           {"greaterthan", t_gt},    {">=", t_ge},
      {"ge", t_ge},           {"<", t_lt},              {"lt", t_lt},
      {"lessthan", t_lt},     {"<=", t_le},             {"le", t_le},
  };
  return kTests;
}

// ---- globals ----

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.kw.empty()) fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments");
  int64_t start = 0;
  int64_t stop;
  int64_t step = 1;
  if (a.pos.size() == 1) {
    stop = to_int_arg(a.pos[0], "range");
  } else {
    start = to_int_arg(a.pos[0], "range");
    stop = to_int_arg(a.pos[1], "range");
    if (a.pos.size() == 3) step = to_int_arg(a.pos[2], "range");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  const __int128 n128 = step > 0 ? (stop > start ? ((__int128)stop - start + step - 1) / step : 0)
                                 : (start > stop ? ((__int128)start - stop - step - 1) / -step : 0);
  // The same bound as jinja2's sandbox (MAX_RANGE).
  if (n128 > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  for (__int128 i = 0; i < n128; ++i) out.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  in.charge(out.size());
  return Value::list(std::move(out));
}

std::vector<std::pair<Value, Value>> dict_from_args(Interpreter& in, CallArgs& a, const char* fname) {
  std::vector<std::pair<Value, Value>> out;
  auto put = [&](const Value& k, const Value& v) {
    if (!hashable(k)) fail(std::string("unhashable type: '") + k.type_name() + "'");
    for (auto& kv : out) {
      if (py_equal(kv.first, k)) {
        kv.second = v;
        return;
      }
    }
    out.emplace_back(k, v);
  };
  if (a.pos.size() > 1) fail(std::string(fname) + " expected at most 1 argument");
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_data().items) put(k, v);
    } else if (src.is_object() && src.object_data().assignable) {
      for (const auto& [k, v] : src.object_data().attrs) put(Value::string(k), v);
    } else {
      for (const Value& pair : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(pair);
        if (kv.size() != 2) fail(std::string(fname) + ": sequence elements must have length 2");
        put(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) put(Value::string(k), v);
  return out;
}

Value g_dict(Interpreter& in, CallArgs& a) { return Value::dict(dict_from_args(in, a, "dict")); }

Value g_namespace(Interpreter& in, CallArgs& a) {
  auto ns = in.new_namespace();
  for (auto& [k, v] : dict_from_args(in, a, "namespace")) {
    if (!k.is_string()) fail("namespace keywords must be strings");
    ns->set(k.str(), v);
  }
  return Value::object(ns);
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  std::string msg = a.pos.empty() ? "" : py_str(a.pos[0]);
  throw JinjaError{std::move(msg), std::string::npos, true};
}

Value g_strftime_now(Interpreter&, CallArgs& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) fail("strftime_now() takes one format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), a.pos[0].str().c_str(), &tm);
  if (n == 0 && !a.pos[0].str().empty()) fail("strftime_now(): format produced no output or is too long");
  return Value::string(std::string(buf, n));
}

const std::vector<std::pair<std::string, Value>>& globals() {
  static const std::vector<std::pair<std::string, Value>> kGlobals = {
      {"range", Value::callable("range", g_range)},
      {"dict", Value::callable("dict", g_dict)},
      {"namespace", Value::callable("namespace", g_namespace)},
      {"raise_exception", Value::callable("raise_exception", g_raise_exception)},
      {"strftime_now", Value::callable("strftime_now", g_strftime_now)},
  };
  return kGlobals;
}

// ---- methods ----

Value method(const char* name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  return Value::callable(name, std::move(fn));
}

Value str_method(Interpreter&, const Value& obj, const std::string& name, bool* found) {
  const std::string s = obj.str();
  *found = true;
  auto simple = [&](const char* n, std::string (*f)(std::string_view)) {
    return method(n, [s, n, f](Interpreter&, CallArgs& a) {
      Params p(n, a, {});
      return Value::string(f(s));
    });
  };
  if (name == "upper") return simple("upper", py_upper);
  if (name == "lower" || name == "casefold") return simple("lower", py_lower);
  if (name == "title") return simple("title", py_title);
  if (name == "capitalize") return simple("capitalize", py_capitalize);
  if (name == "swapcase") {
    return simple("swapcase", [](std::string_view x) {
      std::u32string out;
      for (char32_t c : utf8_decode(x)) {
        if (is_upper_cp(c)) append_case(out, c, Case::kLower);
        else if (is_lower_cp(c)) append_case(out, c, Case::kUpper);
        else out.push_back(c);
      }
      return utf8_encode(out);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip";
    const bool r = name != "lstrip";
    return method("strip", [s, l, r](Interpreter&, CallArgs& a) {
      Params p("strip", a, {"chars"});
      return Value::string(py_strip(s, p.get_or(0, Value::none()), l, r));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method("startswith", [s, starts](Interpreter&, CallArgs& a) {
      Params p(starts ? "startswith" : "endswith", a, {"prefix", "start", "end"});
      if (!p.has(0)) fail("startswith() takes at least 1 argument");
      std::u32string u = sub_range(utf8_decode(s), p, 1, 2);
      std::vector<Value> cands = p.get(0).is_tuple() ? p.get(0).items() : std::vector<Value>{p.get(0)};
      for (const Value& c : cands) {
        std::u32string x = utf8_decode(need_str(c, "startswith arg"));
        if (x.size() > u.size()) continue;
        if (starts ? u.compare(0, x.size(), x) == 0 : u.compare(u.size() - x.size(), x.size(), x) == 0) {
          return Value::boolean(true);
        }
      }
      return Value::boolean(false);
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return method("split", [s, right](Interpreter& in, CallArgs& a) {
      Params p(right ? "rsplit" : "split", a, {"sep", "maxsplit"});
      Value r = py_split(s, p.get_or(0, Value::none()), p.has(1) ? to_int_arg(p.get(1), "maxsplit") : -1, right);
      in.charge(r.items().size());
      return r;
    });
  }
  if (name == "splitlines") {
    return method("splitlines", [s](Interpreter&, CallArgs& a) {
      Params p("splitlines", a, {"keepends"});
      std::vector<std::string> parts;
      for (auto& l : py_splitlines(utf8_decode(s), p.has(0) && p.get(0).truthy())) parts.push_back(utf8_encode(l));
      return str_list(std::move(parts));
    });
  }
  if (name == "replace") {
    return method("replace", [s](Interpreter& in, CallArgs& a) {
      Params p("replace", a, {"old", "new", "count"});
      if (!p.has(0) || !p.has(1)) fail("replace() takes at least 2 arguments");
      const int64_t count = p.has(2) ? to_int_arg(p.get(2), "count") : -1;
      return Value::string(py_replace(s, need_str(p.get(0), "replace arg"), need_str(p.get(1), "replace arg"), count, in));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string op = name;
    return method("find", [s, op](Interpreter&, CallArgs& a) {
      Params p(op.c_str(), a, {"sub", "start", "end"});
      if (!p.has(0)) fail(op + "() takes at least 1 argument");
      const std::u32string full = utf8_decode(s);
      const std::u32string sub = utf8_decode(need_str(p.get(0), "substring"));
      // Offsets are relative to the start argument, normalized like a slice.
      const auto n = static_cast<int64_t>(full.size());
      int64_t b = 0;
      if (p.has(1) && !p.get(1).is_none()) {
        b = to_int_arg(p.get(1), "start");
        if (b < 0) b = std::max<int64_t>(0, b + n);
        b = std::min(b, n);
      }
      const std::u32string hay = sub_range(full, p, 1, 2);
      if (op == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(hay.size()) + 1);
        int64_t c = 0;
        for (size_t pos = hay.find(sub); pos != std::u32string::npos; pos = hay.find(sub, pos + sub.size())) ++c;
        return Value::integer(c);
      }
      const size_t f = (op == "find" || op == "index") ? hay.find(sub) : hay.rfind(sub);
      if (f == std::u32string::npos) {
        if (op == "index" || op == "rindex") fail("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(f) + b);
    });
  }
  if (name == "join") {
    return method("join", [s](Interpreter& in, CallArgs& a) {
      Params p("join", a, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& x : in.iterate(p.get(0))) {
        if (!first) out += s;
        first = false;
        out += need_str(x, "sequence item");
        in.check_size(out.size());
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "format") {
    return method("format", [s](Interpreter& in, CallArgs& a) { return Value::string(brace_format(s, a, in)); });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method("removeprefix", [s, prefix](Interpreter&, CallArgs& a) {
      Params p("removeprefix", a, {"affix"});
      const std::string& x = need_str(p.get(0), "affix");
      if (x.empty() || x.size() > s.size()) return Value::string(s);
      if (prefix && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
      if (!prefix && s.compare(s.size() - x.size(), x.size(), x) == 0) return Value::string(s.substr(0, s.size() - x.size()));
      return Value::string(s);
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const std::string op = name;
    return method("center", [s, op](Interpreter& in, CallArgs& a) {
      Params p(op.c_str(), a, {"width", "fillchar"});
      const int64_t w = to_int_arg(p.get(0), "width");
      in.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)) * 4);
      std::u32string fill = p.has(1) ? utf8_decode(need_str(p.get(1), "fillchar")) : U" ";
      if (fill.size() != 1) fail("The fill character must be exactly one character long");
      if (op == "center") return Value::string(py_center(s, w, fill[0]));
      const auto len = static_cast<int64_t>(utf8_length(s));
      std::string pad;
      for (int64_t i = len; i < w; ++i) utf8_append(pad, fill[0]);
      return Value::string(op == "ljust" ? s + pad : pad + s);
    });
  }
  auto pred = [&](const char* n, bool (*f)(char32_t)) {
    return method(n, [s, f](Interpreter&, CallArgs&) {
      std::u32string u = utf8_decode(s);
      return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), f));
    });
  };
  if (name == "isdigit" || name == "isdecimal") return pred("isdigit", is_digit_cp);
  if (name == "isnumeric") return pred("isnumeric", is_numeric_cp);
  if (name == "isalpha") return pred("isalpha", is_alpha_cp);
  if (name == "isalnum") return pred("isalnum", [](char32_t c) { return is_alpha_cp(c) || is_numeric_cp(c); });
  if (name == "isspace") return pred("isspace", py_isspace);
  if (name == "islower") return method("islower", [s](Interpreter&, CallArgs&) { return Value::boolean(py_islower(s)); });
  if (name == "isupper") return method("isupper", [s](Interpreter&, CallArgs&) { return Value::boolean(py_isupper(s)); });
  *found = false;
  return Value();
}

Value dict_method(const Value& obj, const std::string& name, bool* found) {
  *found = true;
  if (name == "items") {
    return method("items", [obj](Interpreter&, CallArgs& a) {
      Params p("items", a, {});
      return make_pairs(obj);
    });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return method("keys", [obj, keys](Interpreter&, CallArgs& a) {
      Params p(keys ? "keys" : "values", a, {});
      std::vector<Value> out;
      for (const auto& [k, v] : obj.dict_data().items) out.push_back(keys ? k : v);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return method("get", [obj](Interpreter&, CallArgs& a) {
      Params p("get", a, {"key", "default"});
      if (!p.has(0)) fail("get expected at least 1 argument, got 0");
      const Value* v = hashable(p.get(0)) ? obj.dict_data().find(p.get(0)) : nullptr;
      if (!hashable(p.get(0))) fail(std::string("unhashable type: '") + p.get(0).type_name() + "'");
      return v ? *v : p.get_or(1, Value::none());
    });
  }
  if (name == "copy") {
    return method("copy", [obj](Interpreter&, CallArgs&) { return Value::dict(obj.dict_data().items); });
  }
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update") {
    return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  *found = false;
  return Value();
}

Value list_method(const Value& obj, const std::string& name, bool* found) {
  *found = true;
  if (name == "index" || name == "count") {
    const bool index = name == "index";
    return method("index", [obj, index](Interpreter&, CallArgs& a) {
      if (a.pos.size() != 1 || !a.kw.empty()) fail(std::string(index ? "index" : "count") + "() takes exactly one argument");
      int64_t c = 0;
      for (size_t i = 0; i < obj.items().size(); ++i) {
        if (py_equal(obj.items()[i], a.pos[0])) {
          if (index) return Value::integer(static_cast<int64_t>(i));
          ++c;
        }
      }
      if (index) fail(py_repr(a.pos[0]) + " is not in list");
      return Value::integer(c);
    });
  }
  if (name == "copy" && !obj.is_tuple()) {
    return method("copy", [obj](Interpreter&, CallArgs&) { return Value::list(obj.items()); });
  }
  if (!obj.is_tuple() && (name == "append" || name == "clear" || name == "pop" || name == "reverse" ||
                          name == "insert" || name == "sort" || name == "extend" || name == "remove")) {
    return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
  }
  *found = false;
  return Value();
}

}  // namespace

std::string py_lower(std::string_view s) {
  bool ascii = true;
  std::string out(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80) ascii = false;
    else if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return ascii ? out : map_case(s, Case::kLower);
}

std::string py_upper(std::string_view s) {
  bool ascii = true;
  std::string out(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80) ascii = false;
    else if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return ascii ? out : map_case(s, Case::kUpper);
}

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value call_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("No filter named '" + name + "'.");
  return it->second(in, input, args);
}

bool call_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("No test named '" + name + "'.");
  return it->second(in, input, args);
}

const Value* find_global(const std::string& name) {
  for (const auto& [k, v] : globals()) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value bound_method(Interpreter& in, const Value& obj, const std::string& name, bool* found) {
  *found = false;
  if (obj.is_string()) return str_method(in, obj, name, found);
  if (obj.is_dict()) return dict_method(obj, name, found);
  if (obj.is_list()) return list_method(obj, name, found);
  return Value();
}

// Exposed for the interpreter's `%` operator.
std::string format_percent(const std::string& fmt, const Value& args, Interpreter& in) {
  return percent_format(fmt, args, in);
}

}  // namespace pagellm::jinja
