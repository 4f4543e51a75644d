#include "tokenizer/jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace pagellm::jinja {

void fail(std::string message) { throw JinjaError{std::move(message)}; }

// ---- UTF-8 ---------------------------------------------------------------------------------------

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(0xDC00 + c);  // surrogateescape: keeps the byte
      ++i;
    }
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) utf8_append(out, cp);
  return out;
}

size_t utf8_length(std::string_view s) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? s.size() : utf8_decode(s).size();
}

bool utf8_valid(std::string_view s) {
  for (char32_t cp : utf8_decode(s)) {
    if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
  }
  return true;
}

// Python's str.isspace() (and re's \s on str patterns).
bool py_isspace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// ---- Value ---------------------------------------------------------------------------------------

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (py_equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* ObjectData::find(std::string_view name) const {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

void ObjectData::set(const std::string& name, Value v) {
  for (auto& [k, old] : attrs) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  attrs.emplace_back(name, std::move(v));
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  v.b_ = i != 0;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  v.b_ = f != 0;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.b_ = !s.empty();
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(std::vector<Value> items, bool is_tuple) {
  int depth = 0;
  for (const Value& x : items) depth = std::max(depth, x.depth());
  if (depth + 1 > kMaxValueDepth) fail("value nesting deeper than " + std::to_string(kMaxValueDepth));
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  data->depth = depth + 1;
  Value v;
  v.kind_ = Kind::kList;
  v.b_ = !data->items.empty();
  v.list_ = std::move(data);
  return v;
}
Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  int depth = 0;
  for (const auto& kv : items) depth = std::max({depth, kv.first.depth(), kv.second.depth()});
  if (depth + 1 > kMaxValueDepth) fail("value nesting deeper than " + std::to_string(kMaxValueDepth));
  auto data = std::make_shared<DictData>();
  data->items = std::move(items);
  data->depth = depth + 1;
  Value v;
  v.kind_ = Kind::kDict;
  v.b_ = !data->items.empty();
  v.dict_ = std::move(data);
  return v;
}
Value Value::object(std::shared_ptr<ObjectData> obj) {
  Value v;
  v.kind_ = Kind::kObject;
  v.b_ = true;
  v.obj_ = std::move(obj);
  return v;
}
Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn, bool is_macro) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  c->is_macro = is_macro;
  Value v;
  v.kind_ = Kind::kCallable;
  v.b_ = true;
  v.fn_ = std::move(c);
  return v;
}

double Value::as_float() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }

const std::string& Value::undefined_hint() const {
  static const std::string kGeneric = "value is undefined";
  return s_ ? *s_ : kGeneric;
}

int Value::depth() const {
  if (kind_ == Kind::kList) return list_->depth;
  if (kind_ == Kind::kDict) return dict_->depth;
  return 0;
}

bool Value::truthy() const { return b_; }

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return list_->is_tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kObject: return obj_->type_name.c_str();
    case Kind::kCallable: return fn_->is_macro ? "Macro" : "builtin_function_or_method";
  }
  return "object";
}

bool Value::identical(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined: return false;
    case Kind::kNone: return true;
    case Kind::kBool: return b_ == o.b_;
    case Kind::kInt: return i_ == o.i_;  // CPython caches small ints; templates compare those
    case Kind::kFloat: return false;
    case Kind::kString: return s_ == o.s_ || *s_ == *o.s_;
    case Kind::kList: return list_ == o.list_;
    case Kind::kDict: return dict_ == o.dict_;
    case Kind::kObject: return obj_ == o.obj_;
    case Kind::kCallable: return fn_ == o.fn_;
  }
  return false;
}

// ---- comparison ----------------------------------------------------------------------------------

namespace {

// Exact int/float comparison: -1, 0, 1 (NaN compares unordered: returns 2).
int compare_numbers(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) {
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  const double x = a.as_float();
  const double y = b.as_float();
  if (std::isnan(x) || std::isnan(y)) return 2;
  if (x < y) return -1;
  if (x > y) return 1;
  // Equal as doubles; an int beyond 2^53 may still differ from the float.
  const Value& i = a.is_float() ? b : a;
  const Value& f = a.is_float() ? a : b;
  if (!i.is_float() && std::fabs(f.as_float()) < 9.2e18) {
    const auto fi = static_cast<int64_t>(f.as_float());
    if (fi != i.as_int()) {
      const int c = i.as_int() < fi ? -1 : 1;
      return a.is_float() ? -c : c;
    }
  }
  return 0;
}

[[noreturn]] void fail_undefined(const Value& v) { fail(v.undefined_hint()); }

}  // namespace

bool py_equal(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (depth > kMaxValueDepth * 2) fail("comparison nested too deep");
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str() == b.str();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!py_equal(a.items()[i], b.items()[i], depth + 1)) return false;
      }
      return true;
    }
    case K::kDict: {
      const auto& x = a.dict_data().items;
      if (x.size() != b.dict_data().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* w = b.dict_data().find(k);
        if (!w || !py_equal(v, *w, depth + 1)) return false;
      }
      return true;
    }
    default: return a.identical(b);
  }
}

bool py_less(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth * 2) fail("comparison nested too deep");
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == -1;
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order = code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i], depth + 1)) return py_less(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  fail(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" +
       b.type_name() + "'");
}

// ---- str / repr ----------------------------------------------------------------------------------

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, as Python's repr.
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out = "-";
    p = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp = std::atoi(sci.c_str() + e_pos + 1);
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (int_part.size() < static_cast<size_t>(exp) + 1) int_part.push_back('0');
      std::string frac = digits.size() > static_cast<size_t>(exp) + 1 ? digits.substr(exp + 1) : "0";
      out += int_part + "." + frac;
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

namespace {

bool py_isprintable(char32_t cp) {
  if (cp == ' ') return true;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string py_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : utf8_decode(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x80 ? (cp < 0x20 || cp == 0x7F) : !py_isprintable(cp)) {
      char buf[16];
      if (cp >= 0xDC80 && cp <= 0xDCFF) std::snprintf(buf, sizeof(buf), "\\udc%02x", static_cast<unsigned>(cp & 0xFF));
      else if (cp < 0x100) std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      else if (cp < 0x10000) std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      else std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out.push_back(quote);
  return out;
}

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.str();
    default: return py_repr(v);
  }
}

std::string py_repr(const Value& v, int depth) {
  using K = Value::Kind;
  if (depth > kMaxValueDepth * 2) fail("value nested too deep to print");
  switch (v.kind()) {
    case K::kUndefined: return "Undefined";
    case K::kNone: return "None";
    case K::kBool: return v.as_bool() ? "True" : "False";
    case K::kInt: return std::to_string(v.as_int());
    case K::kFloat: return py_float_repr(v.as_float());
    case K::kString: return py_string_repr(v.str());
    case K::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += py_repr(items[i], depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case K::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict_data().items) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(k, depth + 1) + ": " + py_repr(x, depth + 1);
      }
      return out + "}";
    }
    case K::kObject: {
      const ObjectData& o = v.object_data();
      if (!o.assignable) return "<" + o.type_name + ">";
      std::string out = "<" + o.type_name + " {";
      bool first = true;
      for (const auto& [k, x] : o.attrs) {
        if (!first) out += ", ";
        first = false;
        out += py_string_repr(k) + ": " + py_repr(x, depth + 1);
      }
      return out + "}>";
    }
    case K::kCallable: {
      const Callable& c = v.callable_data();
      if (c.is_macro) return std::string("<Macro ").append(py_string_repr(c.name)) + ">";
      return "<built-in method " + c.name + ">";
    }
  }
  return "";
}

// ---- json.dumps ----------------------------------------------------------------------------------

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const char32_t u = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (u >> 10)),
                          static_cast<unsigned>(0xDC00 | (u & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
          }
          out += buf;
        } else {
          utf8_append(out, cp);
        }
      }
    }
  }
  out.push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(f);
}

void json_value(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  using K = Value::Kind;
  const std::string item_sep = o.has_separators ? o.item_separator : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case K::kNone: out += "null"; return;
    case K::kBool: out += v.as_bool() ? "true" : "false"; return;
    case K::kInt: out += std::to_string(v.as_int()); return;
    case K::kFloat: out += json_float(v.as_float()); return;
    case K::kString: json_string(out, v.str(), o.ensure_ascii); return;
    case K::kList: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      bool first = true;
      for (const Value& x : v.items()) {
        if (!first) out += item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        json_value(out, x, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out.push_back(']');
      return;
    }
    case K::kDict: {
      if (v.dict_data().items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict_data().items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return py_less(a->first, b->first); });
      }
      out.push_back('{');
      bool first = true;
      for (const auto* kv : items) {
        const Value& k = kv->first;
        std::string key;
        switch (k.kind()) {
          case K::kString: key = k.str(); break;
          case K::kFloat: key = json_float(k.as_float()); break;
          case K::kBool: key = k.as_bool() ? "true" : "false"; break;
          case K::kInt: key = std::to_string(k.as_int()); break;
          case K::kNone: key = "null"; break;
          default:
            fail(std::string("keys must be str, int, float, bool or None, not ") + k.type_name());
        }
        if (!first) out += item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        json_string(out, key, o.ensure_ascii);
        out += key_sep;
        json_value(out, kv->second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out.push_back('}');
      return;
    }
    default:
      fail(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string py_json_dumps(const Value& v, const JsonDumpOptions& opts) {
  std::string out;
  json_value(out, v, opts, 0);
  return out;
}

}  // namespace pagellm::jinja
