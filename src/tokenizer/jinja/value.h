// Values of the Jinja interpreter: a small model of the Python objects that chat templates see
// (None, bool, int, float, str, list/tuple, dict, namespace, macros and bound methods), with
// Python's semantics for truthiness, equality (1 == 1.0 == True), ordering, str() and repr().
//
// Containers are shared and immutable once built, as in the immutable sandbox that transformers
// renders chat templates with; the only mutable objects are namespaces (attribute assignment).
// Errors inside the interpreter are thrown as JinjaError and turned into a Status at the API edge.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagellm::jinja {

// An error raised while lexing, parsing or rendering. `pos` is a byte offset into the template
// source (npos when unknown); the renderer turns it into line:col.
struct JinjaError {
  std::string message;
  size_t pos = std::string::npos;
  bool from_raise = false;  // raise_exception(): the message is the template author's
  bool resource = false;    // a RenderLimits bound was hit
};
[[noreturn]] void fail(std::string message);

class Value;
class Interpreter;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;  // nesting depth of containers, bounded so recursion over values stays shallow
};

struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order, keys unique under py_equal
  int depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

// Arguments of a call: positional and keyword, in source order.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Attribute bags: namespace() objects (assignable) and the loop variable (read only).
struct ObjectData {
  std::string type_name;  // "Namespace", "LoopContext"
  bool assignable = false;
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

struct Callable {
  std::string name;     // for messages: "m", "items", "raise_exception"
  bool is_macro = false;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject, kCallable };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items);  // keys must be unique
  static Value object(std::shared_ptr<ObjectData> obj);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn,
                        bool is_macro = false);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && list_->is_tuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }  // also valid for bool (0/1)
  double as_float() const;               // bool, int or float
  const std::string& str() const { return *s_; }  // string
  const std::string& undefined_hint() const;      // undefined
  const std::vector<Value>& items() const { return list_->items; }
  const DictData& dict_data() const { return *dict_; }
  ObjectData& object_data() const { return *obj_; }
  const std::shared_ptr<ObjectData>& object_ptr() const { return obj_; }
  const Callable& callable_data() const { return *fn_; }
  int depth() const;

  // Python semantics.
  bool truthy() const;
  const char* type_name() const;  // Python's: 'str', 'int', 'list', 'dict', 'NoneType', ...
  bool identical(const Value& o) const;  // `is`

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // string text, or the undefined value's error hint
  std::shared_ptr<const ListData> list_;
  std::shared_ptr<const DictData> dict_;
  std::shared_ptr<ObjectData> obj_;
  std::shared_ptr<const Callable> fn_;
};

// Deepest container nesting a value may reach; beyond it building the value is an error.
inline constexpr int kMaxValueDepth = 128;

bool py_equal(const Value& a, const Value& b, int depth = 0);
// Python's `<` (TypeError for unorderable types, thrown as JinjaError).
bool py_less(const Value& a, const Value& b, int depth = 0);
// str(v) and repr(v). Undefined is '' under str() and 'Undefined' under repr().
std::string py_str(const Value& v);
std::string py_repr(const Value& v, int depth = 0);
std::string py_float_repr(double f);
std::string py_string_repr(std::string_view s);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys), as transformers' tojson filter.
// indent: nullptr for none, else the indent string (an int indent is that many spaces).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
std::string py_json_dumps(const Value& v, const JsonDumpOptions& opts);

// UTF-8 helpers. Invalid bytes decode as U+DC80+byte (Python's surrogateescape) and encode back to
// the same byte, so any byte string survives a round trip.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);
bool utf8_valid(std::string_view s);
bool py_isspace(char32_t cp);

}  // namespace pagellm::jinja
