#include "tokenizer/jinja/parser.h"

#include <initializer_list>

namespace pagellm::jinja {
namespace {

// Deepest nesting of expressions or blocks; keeps the recursive parser and evaluator off the
// end of the stack on hostile input.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const ParseOptions& opts) : toks_(tokens), opts_(opts) {}

  std::vector<StmtPtr> parse_template() {
    std::vector<StmtPtr> body = subparse({});
    if (cur().type != TokenType::kEof) fail_at("unexpected tag", cur().pos);
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[i_ + 1 < toks_.size() ? i_ + 1 : i_]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  static bool tok_is_name(const Token& t, const char* name) { return t.type == TokenType::kName && t.text == name; }

  [[noreturn]] void fail_at(const std::string& msg, size_t pos) const { throw JinjaError{msg, pos}; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kData: return "template data";
      case TokenType::kVarBegin: return "begin of print statement";
      case TokenType::kVarEnd: return "end of print statement";
      case TokenType::kBlockBegin: return "begin of statement block";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kName: return "'" + t.text + "'";
      case TokenType::kString: return "string";
      case TokenType::kInteger: return "integer";
      case TokenType::kFloat: return "float";
      case TokenType::kOperator: return "'" + t.text + "'";
      case TokenType::kEof: return "end of template";
    }
    return "token";
  }

  void expect_op(const char* op) {
    if (!is_op(op)) fail_at(std::string("expected '") + op + "', got " + describe(cur()), cur().pos);
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail_at("expected name, got " + describe(cur()), cur().pos);
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_name(const char* name) {
    if (!is_name(name)) fail_at(std::string("expected '") + name + "', got " + describe(cur()), cur().pos);
    next();
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) fail_at("expected end of statement block, got " + describe(cur()), cur().pos);
    next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->fail_at("template nested too deeply", p_->cur().pos);
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  static ExprPtr node(ExprKind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // ---- statements ----

  // Parses until a block whose first name is in `end_names` (left unconsumed, positioned on that
  // name) or end of template.
  std::vector<StmtPtr> subparse(std::initializer_list<const char*> end_names) {
    DepthGuard guard(this);
    std::vector<StmtPtr> body;
    while (cur().type != TokenType::kEof) {
      const Token& t = cur();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->pos = t.pos;
        s->expr = parse_tuple(false, true, {}, false);
        if (cur().type != TokenType::kVarEnd) fail_at("expected end of print statement, got " + describe(cur()), cur().pos);
        next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        for (const char* end : end_names) {
          if (is_name(end)) return body;
        }
        body.push_back(parse_statement(end_names));
      } else {
        fail_at("unexpected " + describe(t), t.pos);
      }
    }
    if (end_names.size()) {
      std::string expected;
      for (const char* e : end_names) {
        expected += expected.empty() ? "'" : " or '";
        expected += e;
        expected += "'";
      }
      fail_at("unexpected end of template, expected " + expected, cur().pos);
    }
    return body;
  }

  StmtPtr parse_statement(std::initializer_list<const char*> enclosing_ends) {
    if (cur().type != TokenType::kName) fail_at("tag name expected", cur().pos);
    const std::string tag = cur().text;
    const size_t pos = cur().pos;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") return parse_simple_block(StmtKind::kGeneration, "endgeneration");
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at("'" + tag + "' outside of a loop", pos);
      next();
      expect_block_end();
      auto s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      s->pos = pos;
      return s;
    }
    static const char* const kUnsupported[] = {"block", "extends", "include", "import", "from", "call",
                                               "autoescape", "do", "trans", "pluralize"};
    for (const char* u : kUnsupported) {
      if (tag == u) fail_at("the '" + tag + "' tag is not supported in chat templates", pos);
    }
    std::string msg = "Encountered unknown tag '" + tag + "'.";
    if (enclosing_ends.size()) {
      msg += " Jinja was looking for the following tags:";
      bool first = true;
      for (const char* e : enclosing_ends) {
        msg += first ? " '" : " or '";
        msg += e;
        msg += "'";
        first = false;
      }
      msg += ".";
    }
    fail_at(msg, pos);
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kIf;
    s->pos = cur().pos;
    next();  // 'if' or 'elif'
    s->expr = parse_tuple(false, true, {}, false);
    expect_block_end();
    s->body = subparse({"elif", "else", "endif"});
    if (is_name("elif")) {
      s->else_body.push_back(parse_if());
      return s;
    }
    if (is_name("else")) {
      next();
      expect_block_end();
      s->else_body = subparse({"endif"});
    }
    next();  // endif
    expect_block_end();
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFor;
    s->pos = cur().pos;
    next();
    s->target = parse_assign_target({"in"});
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (is_name("if")) {
      next();
      s->cond = parse_expression(true);
    }
    if (is_name("recursive")) fail_at("recursive for loops are not supported", cur().pos);
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (is_name("else")) {
      next();
      expect_block_end();
      s->else_body = subparse({"endfor"});
    }
    next();  // endfor
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    auto s = std::make_unique<Stmt>();
    s->pos = cur().pos;
    next();
    if (cur().type == TokenType::kName && look().type == TokenType::kOperator && look().text == ".") {
      // namespace attribute: ns.attr
      auto t = node(ExprKind::kGetattr, cur().pos);
      auto n = node(ExprKind::kName, cur().pos);
      n->name = expect_name();
      next();  // '.'
      t->name = expect_name();
      t->args.push_back(std::move(n));
      s->target = std::move(t);
    } else {
      s->target = parse_assign_target({});
    }
    if (is_op("=")) {
      next();
      s->kind = StmtKind::kSet;
      s->expr = parse_tuple(false, true, {}, false);
      expect_block_end();
      return s;
    }
    if (s->target->kind != ExprKind::kName) fail_at("a block set needs a single name", s->pos);
    s->kind = StmtKind::kSetBlock;
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    expect_block_end();
    s->body = subparse({"endset"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kMacro;
    s->pos = cur().pos;
    next();
    s->text = expect_name();
    expect_op("(");
    bool seen_default = false;
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string pname = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression(true);
        seen_default = true;
      } else if (seen_default) {
        fail_at("non-default argument follows default argument", cur().pos);
      }
      s->params.emplace_back(std::move(pname), std::move(def));
    }
    next();
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot cross a macro boundary
    s->body = subparse({"endmacro"});
    loop_depth_ = saved_loops;
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFilterBlock;
    s->pos = cur().pos;
    s->filter = parse_filter(nullptr, true);  // positioned on 'filter': parse_filter skips it
    expect_block_end();
    s->body = subparse({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kWith;
    s->pos = cur().pos;
    next();
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      ExprPtr target = parse_assign_target({});
      expect_op("=");
      ExprPtr value = parse_expression(true);
      s->assigns.emplace_back(std::move(target), std::move(value));
    }
    next();
    s->body = subparse({"endwith"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_simple_block(StmtKind kind, const char* end) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = cur().pos;
    next();
    expect_block_end();
    s->body = subparse({end});
    next();
    expect_block_end();
    return s;
  }

  // A name or a tuple of names.
  ExprPtr parse_assign_target(std::initializer_list<const char*> extra_end) {
    ExprPtr t = parse_tuple(true, true, extra_end, false);
    auto check = [&](const Expr& e) {
      if (e.kind != ExprKind::kName) fail_at("can't assign to this expression", e.pos);
      if (e.name == "true" || e.name == "false" || e.name == "none" || e.name == "True" ||
          e.name == "False" || e.name == "None" || e.name == "loop") {
        fail_at("can't assign to special name '" + e.name + "'", e.pos);
      }
    };
    if (t->kind == ExprKind::kTuple) {
      for (const auto& a : t->args) check(*a);
    } else {
      check(*t);
    }
    return t;
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<const char*> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEof) return true;
    if (t.type == TokenType::kOperator && t.text == ")") return true;
    for (const char* e : extra_end) {
      if (tok_is_name(t, e)) return true;
    }
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parens) {
    const size_t pos = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        items.push_back(parse_primary());
      } else {
        items.push_back(parse_expression(with_condexpr));
      }
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail_at("Expected an expression, got " + describe(cur()), cur().pos);
    }
    auto t = node(ExprKind::kTuple, pos);
    t->args = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      const size_t pos = cur().pos;
      next();
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (is_name("else")) {
        next();
        DepthGuard guard(this);
        expr3 = parse_condexpr();
      }
      auto c = node(ExprKind::kCond, pos);
      c->args.push_back(std::move(expr2));
      c->args.push_back(std::move(expr1));
      c->args.push_back(std::move(expr3));
      expr1 = std::move(c);
    }
    return expr1;
  }

  ExprPtr binary(ExprKind kind, const std::string& op, ExprPtr l, ExprPtr r, size_t pos) {
    auto b = node(kind, pos);
    b->name = op;
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kOr, "or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kAnd, "and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      auto n = node(ExprKind::kNot, cur().pos);
      next();
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t pos = cur().pos;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (cur().type == TokenType::kOperator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && tok_is_name(look(), "in")) {
        ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto c = node(ExprKind::kCompare, pos);
    c->args.push_back(std::move(expr));
    for (auto& o : operands) c->args.push_back(std::move(o));
    c->ops = std::move(ops);
    return c;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kBinary, op, std::move(left), parse_concat(), pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kBinary, "~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kBinary, op, std::move(left), parse_pow(), pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const size_t pos = cur().pos;
      next();
      left = binary(ExprKind::kBinary, "**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      n = node(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur().pos);
      next();
      n->args.push_back(parse_unary(false));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr parse_primary() {
    DepthGuard guard(this);
    const Token& t = cur();
    const size_t pos = t.pos;
    if (t.type == TokenType::kName) {
      auto n = node(ExprKind::kConst, pos);
      if (t.text == "true" || t.text == "True") n->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") n->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") n->value = Value::none();
      else {
        n->kind = ExprKind::kName;
        n->name = t.text;
      }
      next();
      return n;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (cur().type == TokenType::kString) {
        s += cur().text;
        next();
      }
      auto n = node(ExprKind::kConst, pos);
      n->value = Value::string(std::move(s));
      return n;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      auto n = node(ExprKind::kConst, pos);
      n->value = t.type == TokenType::kInteger ? Value::integer(t.int_value) : Value::number(t.float_value);
      next();
      return n;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      auto n = node(ExprKind::kList, pos);
      next();
      while (!is_op("]")) {
        if (!n->args.empty()) expect_op(",");
        if (is_op("]")) break;
        n->args.push_back(parse_expression(true));
      }
      next();
      return n;
    }
    if (is_op("{")) {
      auto n = node(ExprKind::kDict, pos);
      next();
      while (!is_op("}")) {
        if (!n->args.empty()) expect_op(",");
        if (is_op("}")) break;
        n->args.push_back(parse_expression(true));
        expect_op(":");
        n->args.push_back(parse_expression(true));
      }
      next();
      return n;
    }
    fail_at("unexpected " + describe(t), pos);
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else break;
    }
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) n = parse_filter(std::move(n), false);
      else if (is_name("is")) n = parse_test(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else break;
    }
    return n;
  }

  ExprPtr parse_subscript(ExprPtr n) {
    DepthGuard guard(this);
    const size_t pos = cur().pos;
    if (is_op(".")) {
      next();
      if (cur().type == TokenType::kName) {
        auto g = node(ExprKind::kGetattr, pos);
        g->name = cur().text;
        next();
        g->args.push_back(std::move(n));
        return g;
      }
      if (cur().type == TokenType::kInteger) {
        auto g = node(ExprKind::kGetitem, pos);
        auto k = node(ExprKind::kConst, cur().pos);
        k->value = Value::integer(cur().int_value);
        next();
        g->args.push_back(std::move(n));
        g->args.push_back(std::move(k));
        return g;
      }
      fail_at("expected name or number, got " + describe(cur()), cur().pos);
    }
    next();  // '['
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      args.push_back(parse_subscribed());
    }
    next();
    auto g = node(ExprKind::kGetitem, pos);
    g->args.push_back(std::move(n));
    if (args.empty()) fail_at("expected an index expression", pos);
    if (args.size() == 1) {
      g->args.push_back(std::move(args[0]));
    } else {
      auto t = node(ExprKind::kTuple, pos);
      t->args = std::move(args);
      g->args.push_back(std::move(t));
    }
    return g;
  }

  ExprPtr parse_subscribed() {
    const size_t pos = cur().pos;
    auto s = node(ExprKind::kSlice, pos);
    if (is_op(":")) {
      next();
      s->args.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      s->args.push_back(std::move(e));
    }
    if (is_op(":")) s->args.push_back(nullptr);
    else if (!is_op("]") && !is_op(",")) s->args.push_back(parse_expression(true));
    else s->args.push_back(nullptr);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) s->args.push_back(parse_expression(true));
      else s->args.push_back(nullptr);
    } else {
      s->args.push_back(nullptr);
    }
    return s;
  }

  void parse_call_args(Expr* call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail_at("*args and **kwargs in calls are not supported", cur().pos);
      if (cur().type == TokenType::kName && look().type == TokenType::kOperator && look().text == "=") {
        std::string key = cur().text;
        next();
        next();
        call->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!call->kwargs.empty()) fail_at("Invalid argument syntax: positional argument after keyword", cur().pos);
        call->args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    DepthGuard guard(this);
    auto c = node(ExprKind::kCall, cur().pos);
    c->args.push_back(std::move(callee));
    parse_call_args(c.get());
    return c;
  }

  // `| name(args) | name2 ...`; with start_inline the current token is the first name's keyword
  // ('filter' of a filter block) instead of a pipe.
  ExprPtr parse_filter(ExprPtr n, bool start_inline) {
    while (is_op("|") || start_inline) {
      DepthGuard guard(this);
      next();
      start_inline = false;
      auto f = node(ExprKind::kFilter, cur().pos);
      std::string name = expect_name();
      while (is_op(".")) {
        next();
        name += '.';
        name += expect_name();
      }
      if (opts_.has_filter && !opts_.has_filter(name)) fail_at("No filter named '" + name + "'.", f->pos);
      f->name = name;
      f->args.push_back(std::move(n));
      if (is_op("(")) parse_call_args(f.get());
      n = std::move(f);
    }
    return n;
  }

  ExprPtr parse_test(ExprPtr n) {
    DepthGuard guard(this);
    const size_t pos = cur().pos;
    next();  // 'is'
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    auto t = node(ExprKind::kTest, cur().pos);
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += '.';
      name += expect_name();
    }
    if (opts_.has_test && !opts_.has_test(name)) fail_at("No test named '" + name + "'.", t->pos);
    t->name = name;
    t->args.push_back(std::move(n));
    if (is_op("(")) {
      parse_call_args(t.get());
    } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                cur().type == TokenType::kInteger || cur().type == TokenType::kFloat || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_at("You cannot chain multiple tests with is", cur().pos);
      ExprPtr arg = parse_postfix(parse_primary());
      t->args.push_back(std::move(arg));
    }
    if (!negated) return t;
    auto n2 = node(ExprKind::kNot, pos);
    n2->args.push_back(std::move(t));
    return n2;
  }

  const std::vector<Token>& toks_;
  const ParseOptions& opts_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::vector<StmtPtr> parse(const std::vector<Token>& tokens, const ParseOptions& options) {
  return Parser(tokens, options).parse_template();
}

}  // namespace pagellm::jinja
