// The structured-output fields of a completions or chat request, as one grammar spec
// (runtime/grammar.h):
//   response_format  {"type": "text" | "json_object"} or
//                    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (OpenAI)
//   guided_json, guided_regex, guided_choice, guided_grammar          (vLLM's older extras)
//   structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object",
//                       "disable_any_whitespace"}                      (vLLM's current form)
// At most one constraint per request; malformed ones are a 400 naming the field. Whether the
// schema, regex or grammar itself compiles is the compiler's to say (ApiServer answers 400).
#pragma once

#include <optional>

#include "runtime/grammar.h"
#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace pagellm::server {

std::optional<ApiError> parse_structured_output(const Json& body, std::optional<GrammarSpec>& out);

// tool_choice forcing a call: for `name` "" ("required"), a JSON list of one or more
// {"name": <a tool's name>, "parameters": <its parameters>} objects; for a function's name, that
// function's parameters object. 400 when `tools` lacks the function or a schema cannot be used.
std::optional<ApiError> forced_tool_grammar(const Json& tools, const std::string& name,
                                            std::optional<GrammarSpec>& out);

}  // namespace pagellm::server
