// The tree-walking interpreter behind Template::render (internal to the jinja library).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/jinja/value.h"

namespace pagellm::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, std::vector<std::pair<std::string, Value>> context);
  ~Interpreter();  // breaks reference cycles through namespaces and macro scopes

  std::string render(const std::vector<StmtPtr>& body);

  // Used by builtins.
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value call(const Value& callee, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  std::vector<Value> iterate(const Value& v);  // Python iter(): list items, dict keys, str chars
  std::shared_ptr<ObjectData> new_namespace();
  void charge(uint64_t steps);  // count work against the step budget
  void check_size(size_t bytes) const;  // a built string or list must stay under the output cap
  const RenderLimits& limits() const { return limits_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const std::vector<StmtPtr>& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec_stmt(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out, Flow* flow);
  void assign(const Expr& target, const Value& v, const std::shared_ptr<Scope>& scope);
  Value lookup(const std::string& name, const std::shared_ptr<Scope>& scope) const;
  Value eval_binary(const std::string& op, const Value& a, const Value& b);
  bool eval_compare(const std::string& op, const Value& a, const Value& b);
  Value make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value apply_filter_chain(const Expr& f, Value input, const std::shared_ptr<Scope>& scope);
  void append(std::string& out, std::string_view s);

  RenderLimits limits_;
  std::shared_ptr<Scope> root_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<ObjectData>> namespaces_;
  std::vector<std::shared_ptr<Scope>> macro_scopes_;
};

// Builtin tables (builtins.cpp).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value call_filter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool call_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
const Value* find_global(const std::string& name);
// A method of a str / dict / list value, bound to it; Undefined when there is none.
Value bound_method(Interpreter& in, const Value& obj, const std::string& name, bool* found);

// Argument binding for builtins: positional then keyword, by parameter name.
class Params {
 public:
  Params(const char* func, CallArgs& args, std::initializer_list<const char*> names);
  bool has(size_t i) const { return set_[i]; }
  const Value& get(size_t i) const { return values_[i]; }
  Value get_or(size_t i, Value def) const { return set_[i] ? values_[i] : std::move(def); }

 private:
  std::vector<Value> values_;
  std::vector<bool> set_;
};

// Python helpers shared by builtins.
std::string format_percent(const std::string& fmt, const Value& args, Interpreter& in);
int64_t to_int_arg(const Value& v, const char* what);
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);

}  // namespace pagellm::jinja
