#include "tokenizer/jinja/interpreter.h"

#include <cmath>
#include <new>

#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace pagellm::jinja {

namespace {

[[noreturn]] void fail_limit(std::string msg) {
  JinjaError e{std::move(msg)};
  e.resource = true;
  throw e;
}

[[noreturn]] void fail_undefined(const Value& v) { fail(v.undefined_hint()); }

std::string type_object(const Value& v) {
  return v.is_none() ? std::string("'None'") : std::string("'").append(v.type_name()) + " object'";
}

}  // namespace

// ---- scopes ----

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

// ---- interpreter ----

Interpreter::Interpreter(const RenderLimits& limits, std::vector<std::pair<std::string, Value>> context)
    : limits_(limits), root_(std::make_shared<Scope>()) {
  root_->vars = std::move(context);
}

Interpreter::~Interpreter() {
  // Namespaces can hold themselves and macros hold their defining scope (which holds them):
  // clear them so the shared_ptr cycles are freed, and freed one level at a time.
  for (auto& ns : namespaces_) ns->attrs.clear();
  for (auto& s : macro_scopes_) s->vars.clear();
}

void Interpreter::charge(uint64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps) {
    fail_limit("template exceeded its budget of " + std::to_string(limits_.max_steps) +
               " evaluation steps (endless or very long loop?)");
  }
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    fail_limit("template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
}

void Interpreter::append(std::string& out, std::string_view s) {
  check_size(out.size() + s.size());
  out.append(s);
}

std::shared_ptr<ObjectData> Interpreter::new_namespace() {
  auto ns = std::make_shared<ObjectData>();
  ns->type_name = "Namespace";
  ns->assignable = true;
  namespaces_.push_back(ns);
  charge(1);
  return ns;
}

std::string Interpreter::render(const std::vector<StmtPtr>& body) {
  std::string out;
  exec(body, root_, out);
  return out;
}

Interpreter::Flow Interpreter::exec(const std::vector<StmtPtr>& body, const std::shared_ptr<Scope>& scope,
                                    std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  charge(1);
  try {
    switch (s.kind) {
      case StmtKind::kData:
        append(out, s.text);
        return Flow::kNormal;
      case StmtKind::kOutput:
        append(out, py_str(eval(*s.expr, scope)));
        return Flow::kNormal;
      case StmtKind::kIf:
        return exec(eval(*s.expr, scope).truthy() ? s.body : s.else_body, scope, out);
      case StmtKind::kFor: {
        Flow flow = Flow::kNormal;
        exec_for(s, scope, out, &flow);
        return flow;
      }
      case StmtKind::kSet:
        assign(*s.target, eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case StmtKind::kSetBlock: {
        std::string buf;
        exec(s.body, scope, buf);
        Value v = Value::string(std::move(buf));
        if (s.filter) v = apply_filter_chain(*s.filter, v, scope);
        assign(*s.target, v, scope);
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        scope->set(s.text, make_macro(s, scope));
        return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kFilterBlock: {
        std::string buf;
        const Flow f = exec(s.body, scope, buf);
        append(out, py_str(apply_filter_chain(*s.filter, Value::string(std::move(buf)), scope)));
        return f;
      }
      case StmtKind::kWith: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        std::vector<Value> values;
        for (const auto& [target, value] : s.assigns) values.push_back(eval(*value, scope));
        for (size_t i = 0; i < values.size(); ++i) assign(*s.assigns[i].first, values[i], inner);
        return exec(s.body, inner, out);
      }
      case StmtKind::kGeneration:
        return exec(s.body, scope, out);
    }
  } catch (JinjaError& e) {
    if (e.pos == std::string::npos) e.pos = s.pos;
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out, Flow* flow) {
  const Value iterable = eval(*s.expr, scope);
  std::vector<Value> items = iterate(iterable);
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(*s.target, item, probe);
      if (eval(*s.cond, probe).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const auto n = static_cast<int64_t>(items.size());
  if (n == 0) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    *flow = exec(s.else_body, inner, out);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    charge(1);
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    auto loop = std::make_shared<ObjectData>();
    loop->type_name = "LoopContext";
    loop->attrs = {
        {"index", Value::integer(i + 1)},
        {"index0", Value::integer(i)},
        {"revindex", Value::integer(n - i)},
        {"revindex0", Value::integer(n - i - 1)},
        {"first", Value::boolean(i == 0)},
        {"last", Value::boolean(i == n - 1)},
        {"length", Value::integer(n)},
        {"depth", Value::integer(1)},
        {"depth0", Value::integer(0)},
        {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
        {"cycle", Value::callable("cycle", [i](Interpreter&, CallArgs& a) {
           if (a.pos.empty()) fail("no items for cycling given");
           return a.pos[static_cast<size_t>(i) % a.pos.size()];
         })},
    };
    inner->vars.emplace_back("loop", Value::object(loop));
    assign(*s.target, items[i], inner);
    const Flow f = exec(s.body, inner, out);
    if (f == Flow::kBreak) break;
  }
  *flow = Flow::kNormal;
}

void Interpreter::assign(const Expr& target, const Value& v, const std::shared_ptr<Scope>& scope) {
  switch (target.kind) {
    case ExprKind::kName:
      scope->set(target.name, v);
      return;
    case ExprKind::kTuple: {
      std::vector<Value> items = iterate(v);
      const size_t want = target.args.size();
      if (items.size() > want) fail("too many values to unpack (expected " + std::to_string(want) + ")");
      if (items.size() < want) {
        fail("not enough values to unpack (expected " + std::to_string(want) + ", got " +
             std::to_string(items.size()) + ")");
      }
      for (size_t i = 0; i < want; ++i) assign(*target.args[i], items[i], scope);
      return;
    }
    case ExprKind::kGetattr: {
      const Value ns = lookup(target.args[0]->name, scope);
      if (!ns.is_object() || !ns.object_data().assignable) {
        fail("cannot assign attribute on non-namespace object");
      }
      ns.object_data().set(target.name, v);
      return;
    }
    default:
      fail("can't assign to this expression");
  }
}

Value Interpreter::lookup(const std::string& name, const std::shared_ptr<Scope>& scope) const {
  if (const Value* v = scope->find(name)) return *v;
  if (const Value* g = find_global(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  macro_scopes_.push_back(scope);
  const Stmt* def = &s;
  std::weak_ptr<Scope> weak = scope;  // the scope holds the macro: keep the cycle weak
  return Value::callable(
      s.text,
      [def, weak](Interpreter& in, CallArgs& a) -> Value {
        std::shared_ptr<Scope> parent = weak.lock();
        if (!parent) fail("macro '" + def->text + "' outlived its scope");
        const size_t n_params = def->params.size();
        if (a.pos.size() > n_params) {
          fail("macro '" + def->text + "' takes not more than " + std::to_string(n_params) + " argument(s)");
        }
        auto local = std::make_shared<Scope>();
        local->parent = parent;
        std::vector<bool> given(n_params, false);
        std::vector<Value> values(n_params);
        for (size_t i = 0; i < a.pos.size(); ++i) {
          values[i] = a.pos[i];
          given[i] = true;
        }
        for (auto& [k, v] : a.kw) {
          size_t i = 0;
          while (i < n_params && def->params[i].first != k) ++i;
          if (i == n_params) fail("macro '" + def->text + "' takes no keyword argument '" + k + "'");
          if (given[i]) fail("macro '" + def->text + "' got multiple values for argument '" + k + "'");
          values[i] = v;
          given[i] = true;
        }
        for (size_t i = 0; i < n_params; ++i) {
          if (!given[i]) {
            values[i] = def->params[i].second ? in.eval(*def->params[i].second, local)
                                              : Value::undefined("parameter '" + def->params[i].first + "' was not provided");
          }
          local->set(def->params[i].first, values[i]);
        }
        if (++in.call_depth_ > in.limits_.max_call_depth) {
          --in.call_depth_;
          fail_limit("macro calls nested deeper than " + std::to_string(in.limits_.max_call_depth));
        }
        std::string buf;
        try {
          in.exec(def->body, local, buf);
        } catch (...) {
          --in.call_depth_;
          throw;
        }
        --in.call_depth_;
        return Value::string(std::move(buf));
      },
      true);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_data().items.size());
      for (const auto& kv : v.dict_data().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::u32string u = utf8_decode(v.str());
      charge(u.size());
      chars.reserve(u.size());
      for (char32_t c : u) {
        std::string s;
        utf8_append(s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    default: fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (!callee.is_callable()) fail(std::string("'") + callee.type_name() + "' object is not callable");
  return callee.callable_data().fn(*this, args);
}

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!name.empty() && name[0] == '_') {
    return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  }
  bool found = false;
  Value m = bound_method(*this, obj, name, &found);
  if (found) return m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().find(std::string_view(name))) return *v;
  } else if (obj.is_object()) {
    if (const Value* v = obj.object_data().find(name)) return *v;
  }
  return Value::undefined(type_object(obj) + " has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      if (const Value* v = obj.dict_data().find(key)) return *v;
      break;
    }
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.as_int();
        if (obj.is_list()) {
          const auto n = static_cast<int64_t>(obj.items().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
          return Value::undefined(type_object(obj) + " has no element " + std::to_string(key.as_int()));
        }
        const std::u32string u = utf8_decode(obj.str());
        const auto n = static_cast<int64_t>(u.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string s;
          utf8_append(s, u[static_cast<size_t>(i)]);
          return Value::string(std::move(s));
        }
        return Value::undefined(type_object(obj) + " has no element " + std::to_string(key.as_int()));
      }
      break;
    }
    default: break;
  }
  // jinja2 falls back to attribute lookup for string keys.
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(type_object(obj) + " has no element " + py_repr(key));
}

namespace {

// Python's slice.indices(): normalized start, stop, step for a sequence of length n.
void slice_indices(const Value& start_v, const Value& stop_v, const Value& step_v, int64_t n, int64_t* start,
                   int64_t* stop, int64_t* step) {
  auto idx = [](const Value& v) -> int64_t {
    if (v.is_int() || v.is_bool()) return v.as_int();
    if (v.is_undefined()) fail(v.undefined_hint());
    fail("slice indices must be integers or None or have an __index__ method");
  };
  *step = step_v.is_none() ? 1 : idx(step_v);
  if (*step == 0) fail("slice step cannot be zero");
  if (*step == INT64_MIN) *step = -INT64_MAX;
  const bool neg = *step < 0;
  auto adjust = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t x = idx(v);
    if (x < 0) {
      x = x < -n ? (neg ? -1 : 0) : x + n;
    } else if (x >= n) {
      x = neg ? n - 1 : n;
    }
    return x;
  };
  *start = adjust(start_v, neg ? n - 1 : 0);
  *stop = adjust(stop_v, neg ? -1 : n);
}

}  // namespace

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  charge(1);
  try {
    switch (e.kind) {
      case ExprKind::kConst: return e.value;
      case ExprKind::kName: return lookup(e.name, scope);
      case ExprKind::kGetattr: return get_attr(eval(*e.args[0], scope), e.name);
      case ExprKind::kGetitem: {
        const Value obj = eval(*e.args[0], scope);
        const Expr& k = *e.args[1];
        if (k.kind != ExprKind::kSlice) return get_item(obj, eval(k, scope));
        if (obj.is_undefined()) fail_undefined(obj);
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = k.args[i] ? eval(*k.args[i], scope) : Value::none();
        if (!obj.is_list() && !obj.is_string()) {
          return Value::undefined(type_object(obj) + " is not subscriptable with a slice");
        }
        std::u32string u;
        if (obj.is_string()) u = utf8_decode(obj.str());
        const auto n = static_cast<int64_t>(obj.is_list() ? obj.items().size() : u.size());
        int64_t start, stop, step;
        slice_indices(parts[0], parts[1], parts[2], n, &start, &stop, &step);
        std::vector<Value> items;
        std::u32string chars;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (obj.is_list()) items.push_back(obj.items()[static_cast<size_t>(i)]);
          else chars.push_back(u[static_cast<size_t>(i)]);
          if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        charge(items.size() + chars.size());
        if (obj.is_list()) return Value::list(std::move(items), obj.is_tuple());
        return Value::string(utf8_encode(chars));
      }
      case ExprKind::kSlice: fail("slice outside of a subscript");
      case ExprKind::kCall: {
        const Value callee = eval(*e.args[0], scope);
        CallArgs args;
        for (size_t i = 1; i < e.args.size(); ++i) args.pos.push_back(eval(*e.args[i], scope));
        for (const auto& [k, v] : e.kwargs) args.kw.emplace_back(k, eval(*v, scope));
        return call(callee, args);
      }
      case ExprKind::kFilter: {
        return apply_filter_chain(e, Value(), scope);
      }
      case ExprKind::kTest: {
        const Value input = eval(*e.args[0], scope);
        CallArgs args;
        for (size_t i = 1; i < e.args.size(); ++i) args.pos.push_back(eval(*e.args[i], scope));
        for (const auto& [k, v] : e.kwargs) args.kw.emplace_back(k, eval(*v, scope));
        return Value::boolean(apply_test(e.name, input, args));
      }
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        const Value v = eval(*e.args[0], scope);
        if (v.is_undefined()) fail_undefined(v);
        const bool neg = e.kind == ExprKind::kNeg;
        if (v.is_float()) return Value::number(neg ? -v.as_float() : v.as_float());
        if (v.is_int() || v.is_bool()) {
          if (neg && v.as_int() == INT64_MIN) fail("integer overflow");
          return Value::integer(neg ? -v.as_int() : v.as_int());
        }
        fail(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + v.type_name() + "'");
      }
      case ExprKind::kNot: return Value::boolean(!eval(*e.args[0], scope).truthy());
      case ExprKind::kAnd: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? eval(*e.args[1], scope) : a;
      }
      case ExprKind::kOr: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? a : eval(*e.args[1], scope);
      }
      case ExprKind::kBinary: {
        const Value a = eval(*e.args[0], scope);
        const Value b = eval(*e.args[1], scope);
        return eval_binary(e.name, a, b);
      }
      case ExprKind::kCompare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!eval_compare(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kCond: {
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          Value v = eval(*e.args[i + 1], scope);
          if (k.is_dict() || (k.is_list() && !k.is_tuple())) fail(std::string("unhashable type: '") + k.type_name() + "'");
          bool replaced = false;
          for (auto& kv : items) {
            if (py_equal(kv.first, k)) {
              kv.second = v;
              replaced = true;
              break;
            }
          }
          if (!replaced) items.emplace_back(std::move(k), std::move(v));
        }
        return Value::dict(std::move(items));
      }
    }
  } catch (JinjaError& err) {
    if (err.pos == std::string::npos) err.pos = e.pos;
    throw;
  }
  fail("unknown expression");
}

Value Interpreter::apply_filter_chain(const Expr& f, Value input, const std::shared_ptr<Scope>& scope) {
  // A filter node's args[0] is its input expression (null at the head of a block filter chain).
  const Value in_value = f.args[0] ? (f.args[0]->kind == ExprKind::kFilter ? apply_filter_chain(*f.args[0], input, scope)
                                                                         : eval(*f.args[0], scope))
                                   : input;
  CallArgs args;
  for (size_t i = 1; i < f.args.size(); ++i) args.pos.push_back(eval(*f.args[i], scope));
  for (const auto& [k, v] : f.kwargs) args.kw.emplace_back(k, eval(*v, scope));
  try {
    return apply_filter(f.name, in_value, args);
  } catch (JinjaError& err) {
    if (err.pos == std::string::npos) err.pos = f.pos;
    throw;
  }
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  charge(1);
  Value r = call_filter(*this, name, input, args);
  if (r.is_string()) check_size(r.str().size());
  return r;
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  charge(1);
  return call_test(*this, name, input, args);
}

namespace {

[[noreturn]] void fail_overflow() { fail("integer overflow (values beyond 64 bits are not supported)"); }
int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail_overflow();
  return r;
}
int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) fail_overflow();
  return r;
}
int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail_overflow();
  return r;
}

// Python's float divmod.
void float_divmod(double x, double y, double* div, double* mod) {
  if (y == 0) fail("float division by zero");
  double m = std::fmod(x, y);
  double d = (x - m) / y;
  if (m != 0) {
    if ((y < 0) != (m < 0)) {
      m += y;
      d -= 1.0;
    }
  } else {
    m = std::copysign(0.0, y);
  }
  double fd;
  if (d != 0) {
    fd = std::floor(d);
    if (d - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, x / y);
  }
  *div = fd;
  *mod = m;
}

}  // namespace

Value Interpreter::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = py_str(a);
    s += py_str(b);
    check_size(s.size());
    return Value::string(std::move(s));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value::integer(add_checked(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value::string(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      charge(items.size());
      return Value::list(std::move(items), a.is_tuple());
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) return Value::integer(sub_checked(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() - b.as_float());
    return unsupported();
  }
  if (op == "*") {
    if (ints) return Value::integer(mul_checked(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() * b.as_float());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (count->is_int() || count->is_bool())) {
      const int64_t n = std::max<int64_t>(count->as_int(), 0);
      if (seq->is_string()) {
        if (n && seq->str().size() > limits_.max_output_bytes / static_cast<uint64_t>(n)) check_size(SIZE_MAX);
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->str();
        return Value::string(std::move(out));
      }
      const uint64_t total = seq->items().size() * static_cast<uint64_t>(n);
      if (n && total / static_cast<uint64_t>(n) != seq->items().size()) check_size(SIZE_MAX);
      charge(total);
      std::vector<Value> out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(out), seq->is_tuple());
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_float() == 0) fail("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(format_percent(a.str(), b, *this));
    if (!nums) return unsupported();
    if (ints) {
      const int64_t x = a.as_int();
      const int64_t y = b.as_int();
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value::integer(0);
        fail("integer overflow");
      }
      int64_t q = x / y;
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    double d, m;
    float_divmod(a.as_float(), b.as_float(), &d, &m);
    return Value::number(op == "//" ? d : m);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int();
      int64_t e = b.as_int();
      int64_t r = 1;
      while (e > 0) {
        if (e & 1) r = mul_checked(r, base);
        e >>= 1;
        if (e) base = mul_checked(base, base);
      }
      return Value::integer(r);
    }
    const double x = a.as_float();
    const double y = b.as_float();
    if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) fail("a negative number raised to a fractional power is complex (unsupported)");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail("(34, 'Numerical result out of range')");
    return Value::number(r);
  }
  fail("unknown operator " + op);
}

bool Interpreter::eval_compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return py_less(a, b) || py_equal(a, b);
  if (op == ">=") return py_less(b, a) || py_equal(a, b);
  if (op == "in" || op == "notin") {
    CallArgs args;
    args.pos.push_back(b);
    const bool r = call_test(*this, "in", a, args);
    return op == "in" ? r : !r;
  }
  fail("unknown comparison " + op);
}

// ---- public API ----

struct Program {
  std::string source;  // normalized
  std::vector<StmtPtr> body;
};

namespace {

std::string where(const std::string& source, size_t pos) {
  if (pos == std::string::npos || pos > source.size()) return "";
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  const size_t col = utf8_length(std::string_view(source).substr(line_start, pos - line_start)) + 1;
  return "line " + std::to_string(line) + ", column " + std::to_string(col) + ": ";
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) fail("context nested deeper than " + std::to_string(kMaxValueDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (const auto& [k, v] : j.items()) items.emplace_back(Value::string(k), from_json(v, depth + 1));
      return Value::dict(std::move(items));
    }
    default: fail("unsupported JSON value in the template context");
  }
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->source = normalize_newlines(source, false);
  try {
    if (!utf8_valid(program->source)) throw JinjaError{"template is not valid UTF-8", std::string::npos};
    ParseOptions opts;
    opts.has_filter = has_filter;
    opts.has_test = has_test;
    const std::vector<Token> tokens = lex(program->source, LexOptions{});
    program->body = jinja::parse(tokens, opts);
  } catch (const JinjaError& e) {
    return invalid_argument("chat template syntax error at " + where(program->source, e.pos) + e.message);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template: out of memory while parsing");
  } catch (const std::exception& e) {
    return internal_error(std::string("chat template: internal error while parsing: ") + e.what());
  }
  Template t;
  t.program_ = std::move(program);
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  if (!program_) return invalid_argument("chat template: render() on an empty Template");
  if (!context.is_object() && !context.is_null()) return invalid_argument("chat template context must be a JSON object");
  try {
    std::vector<std::pair<std::string, Value>> vars;
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) vars.emplace_back(k, from_json(v, 0));
    }
    Interpreter in(limits, std::move(vars));
    return in.render(program_->body);
  } catch (const JinjaError& e) {
    if (e.from_raise) return invalid_argument("chat template raised an exception: " + e.message);
    const std::string msg = "chat template error at " + where(program_->source, e.pos) + e.message;
    return e.resource ? resource_exhausted(msg) : invalid_argument(msg);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template: out of memory while rendering");
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("chat template context: ") + e.what());
  } catch (const std::exception& e) {
    // Not expected (every failure path throws JinjaError); keep a server alive regardless.
    return internal_error(std::string("chat template: internal error: ") + e.what());
  }
}

}  // namespace pagellm::jinja
