// Syntax tree of a parsed template. One generic node type per layer (expressions, statements);
// the fields used by each kind are listed next to it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace pagellm::jinja {

enum class ExprKind : uint8_t {
  kConst,    // value
  kName,     // name
  kGetattr,  // args[0].name
  kGetitem,  // args[0][args[1]]   (args[1] may be a kSlice)
  kSlice,    // args[0]:args[1]:args[2], each may be null
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs); args[0] is null in a {% filter %} block
  kTest,     // args[0] is name(args[1..], kwargs)
  kNeg,      // -args[0]
  kPos,      // +args[0]
  kNot,      // not args[0]
  kBinary,   // args[0] <name> args[1]: + - * / // % ** ~
  kAnd,      // args[0] and args[1]
  kOr,       // args[0] or args[1]
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
  kCond,     // args[1] if args[0] else args[2] (args[2] may be null)
  kList,     // [args...]
  kTuple,    // (args...)
  kDict,     // {args[0]: args[1], args[2]: args[3], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  size_t pos = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

enum class StmtKind : uint8_t {
  kData,         // text
  kOutput,       // {{ expr }}
  kIf,           // if expr: body else else_body (elif is a nested kIf in else_body)
  kFor,          // for target in expr [if cond]: body else else_body
  kSet,          // set target = expr
  kSetBlock,     // set target: body, optionally filtered by filter (a kFilter chain over null)
  kMacro,        // macro text(params): body
  kBreak,
  kContinue,
  kFilterBlock,  // filter filter: body
  kWith,         // with params (targets + values): body
  kGeneration,   // transformers' {% generation %}: body rendered as is
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

struct Stmt {
  StmtKind kind;
  size_t pos = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  ExprPtr filter;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro params (default may be null)
  std::vector<std::pair<ExprPtr, ExprPtr>> assigns;     // with
  std::vector<StmtPtr> body;
  std::vector<StmtPtr> else_body;
};

}  // namespace pagellm::jinja
