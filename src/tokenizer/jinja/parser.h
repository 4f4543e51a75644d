// Recursive-descent parser following jinja2's grammar and operator precedence (including its
// quirks: `**` is left-associative, tests bind tighter than arithmetic, unary minus binds looser
// than filters). Unknown filter or test names are errors at parse time, as jinja2 reports them
// when compiling.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace pagellm::jinja {

struct ParseOptions {
  std::function<bool(const std::string&)> has_filter;
  std::function<bool(const std::string&)> has_test;
};

// Throws JinjaError (with pos) on a syntax error.
std::vector<StmtPtr> parse(const std::vector<Token>& tokens, const ParseOptions& options);

}  // namespace pagellm::jinja
