// A Jinja template engine for chat templates: renders byte for byte what Python's jinja2 renders
// with the environment transformers uses (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, its tojson / raise_exception / strftime_now, no autoescape).
//
//   PAGELLM_ASSIGN_OR_RETURN(auto tmpl, jinja::Template::parse(source));
//   PAGELLM_ASSIGN_OR_RETURN(std::string text, tmpl.render(context));
//
// Any failure — a syntax error (with line:col), an unknown filter or test, raise_exception(), a
// type error, or a resource limit — is a Status, never a crash. Unsupported constructs (template
// inheritance, includes, call blocks, recursive loops) are refused with a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace pagellm::jinja {

// Bounds that keep a hostile template from hanging or exhausting memory. The defaults are far
// above what any published chat template needs (they render in well under a million steps).
struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text, and any one string built
  uint64_t max_steps = 50'000'000;             // evaluated nodes + items processed by filters
  int max_call_depth = 64;                     // nested macro calls
};

struct Program;

class Template {
 public:
  // Parses `source` (UTF-8). Errors: invalid_argument with "line L, column C: message".
  static Result<Template> parse(std::string_view source);

  // Renders with `context` (a JSON object; its keys are the template's variables). Use
  // nlohmann::ordered_json so that dicts keep their key order, as Python's do: tojson and
  // iteration over a mapping depend on it.
  // Errors: invalid_argument (template errors, raise_exception), resource_exhausted (limits).
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace pagellm::jinja
