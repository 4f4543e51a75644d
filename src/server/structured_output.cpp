#include "server/structured_output.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace pagellm::server {
namespace {

constexpr auto kReplace = Json::error_handler_t::replace;

// JSON-schema keywords the grammar compiler cannot enforce (it would drop them and let through
// outputs that break them): a request using one is refused rather than silently loosened.
constexpr const char* kUnsupportedKeywords[] = {
    "not",      "if",          "then",        "else",       "dependentRequired", "dependentSchemas",
    "contains", "minContains", "maxContains", "uniqueItems"};

// The first unsupported keyword in `schema` or a subschema of it, with its JSON pointer.
std::optional<std::string> unsupported_keyword(const Json& schema, const std::string& at) {
  if (!schema.is_object()) return std::nullopt;
  for (const char* k : kUnsupportedKeywords)
    if (schema.contains(k) && !(std::string(k) == "uniqueItems" && schema[k] == false))
      return "'" + std::string(k) + "' at " + (at.empty() ? "/" : at);
  auto each_value = [&](const char* key) -> std::optional<std::string> {
    if (!schema.contains(key)) return std::nullopt;
    const Json& v = schema[key];
    if (v.is_object()) {
      for (const auto& [name, sub] : v.items())
        if (auto r = unsupported_keyword(sub, at + "/" + key + "/" + name)) return r;
    }
    return std::nullopt;
  };
  auto each_item = [&](const char* key) -> std::optional<std::string> {
    if (!schema.contains(key)) return std::nullopt;
    const Json& v = schema[key];
    if (v.is_object()) return unsupported_keyword(v, at + "/" + key);
    if (v.is_array())
      for (size_t i = 0; i < v.size(); ++i)
        if (auto r = unsupported_keyword(v[i], at + "/" + key + "/" + std::to_string(i))) return r;
    return std::nullopt;
  };
  for (const char* key : {"properties", "patternProperties", "$defs", "definitions"})
    if (auto r = each_value(key)) return r;
  for (const char* key :
       {"items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf"})
    if (auto r = each_item(key)) return r;
  return std::nullopt;
}

// A schema given as an object, or as the JSON text of one (vLLM takes both).
std::optional<ApiError> schema_text(const Json& v, const std::string& field, std::string& out) {
  Json schema;
  if (v.is_object() || v.is_boolean()) {
    schema = v;
  } else if (v.is_string()) {
    schema = Json::parse(v.get<std::string>(), nullptr, false);
    if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean()))
      return bad_request("'" + field + "' is not a JSON schema (an object)", field);
  } else {
    return bad_request("'" + field + "' must be a JSON schema object", field);
  }
  if (auto k = unsupported_keyword(schema, ""))
    return bad_request("'" + field + "' uses the JSON-schema keyword " + *k +
                           ", which structured output cannot enforce",
                       field);
  out = schema.dump(-1, ' ', false, kReplace);
  return std::nullopt;
}

std::optional<ApiError> string_field(const Json& v, const std::string& field, std::string& out) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    return bad_request("'" + field + "' must be a non-empty string", field);
  out = v.get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> choices_field(const Json& v, const std::string& field,
                                      std::vector<std::string>& out) {
  if (!v.is_array() || v.empty())
    return bad_request("'" + field + "' must be a non-empty list of strings", field);
  for (const Json& c : v) {
    if (!c.is_string() || c.get_ref<const std::string&>().empty())
      return bad_request("'" + field + "' must be a non-empty list of non-empty strings", field);
    out.push_back(c.get<std::string>());
  }
  return std::nullopt;
}

// Records one constraint; a second one is an error naming both.
class Collector {
 public:
  std::optional<ApiError> add(GrammarSpec spec, const std::string& field) {
    if (spec_)
      return bad_request(
          "give one structured-output constraint, not both '" + field_ + "' and '" + field + "'",
          field);
    spec_ = std::move(spec);
    field_ = field;
    return std::nullopt;
  }
  std::optional<GrammarSpec>& spec() { return spec_; }

 private:
  std::optional<GrammarSpec> spec_;
  std::string field_;
};

std::optional<ApiError> parse_response_format(const Json& rf, Collector& c) {
  const Json* t = rf.is_object() && rf.contains("type") ? &rf["type"] : nullptr;
  if (!t || !t->is_string())
    return bad_request("'response_format' must be an object with a 'type'", "response_format");
  if (*t == "text") return std::nullopt;
  if (*t == "json_object") return c.add({GrammarKind::kJsonObject}, "response_format");
  if (*t == "json_schema") {
    const Json* js = rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
    if (!js || !js->is_object())
      return bad_request("'response_format' of type 'json_schema' needs a 'json_schema' object",
                         "response_format.json_schema");
    if (js->contains("name") && !(*js)["name"].is_string())
      return bad_request("'json_schema.name' must be a string", "response_format.json_schema.name");
    GrammarSpec s{GrammarKind::kJsonSchema};
    // OpenAI: the schema may be left out, meaning any JSON object.
    if (!js->contains("schema")) return c.add({GrammarKind::kJsonObject}, "response_format");
    if (auto e = schema_text((*js)["schema"], "response_format.json_schema.schema", s.text))
      return e;
    return c.add(std::move(s), "response_format");
  }
  return bad_request(
      "'response_format' type must be 'text', 'json_object' or 'json_schema', got '" +
          t->get<std::string>() + "'",
      "response_format.type");
}

// One constraint of `kind` from the request's value `v` of `field`.
std::optional<ApiError> add_spec(GrammarKind kind, const Json& v, const std::string& field,
                                 Collector& c) {
  GrammarSpec s{kind};
  std::optional<ApiError> e;
  switch (kind) {
    case GrammarKind::kJsonSchema:
      e = schema_text(v, field, s.text);
      break;
    case GrammarKind::kChoice:
      e = choices_field(v, field, s.choices);
      break;
    case GrammarKind::kRegex:
    case GrammarKind::kEbnf:
      e = string_field(v, field, s.text);
      break;
    case GrammarKind::kJsonObject:
      break;
  }
  if (e) return e;
  return c.add(std::move(s), field);
}

// vLLM's older per-kind request fields, and the keys of its structured_outputs object.
constexpr std::pair<const char*, GrammarKind> kGuidedFields[] = {
    {"guided_json", GrammarKind::kJsonSchema},
    {"guided_regex", GrammarKind::kRegex},
    {"guided_choice", GrammarKind::kChoice},
    {"guided_grammar", GrammarKind::kEbnf}};
constexpr std::pair<const char*, GrammarKind> kStructuredOutputsKeys[] = {
    {"json", GrammarKind::kJsonSchema},
    {"regex", GrammarKind::kRegex},
    {"choice", GrammarKind::kChoice},
    {"grammar", GrammarKind::kEbnf}};

std::optional<ApiError> parse_vllm_fields(const Json& b, Collector& c) {
  for (const auto& [field, kind] : kGuidedFields)
    if (b.contains(field))
      if (auto e = add_spec(kind, b[field], field, c)) return e;
  return std::nullopt;
}

std::optional<ApiError> parse_structured_outputs(const Json& so, Collector& c,
                                                 bool& disable_any_whitespace) {
  const std::string f = "structured_outputs";
  if (so.is_null()) return std::nullopt;
  if (!so.is_object()) return bad_request("'structured_outputs' must be an object", f);
  for (const auto& [key, v] : so.items()) {
    const std::string field = f + "." + key;
    if (v.is_null()) continue;
    const auto* known =
        std::find_if(std::begin(kStructuredOutputsKeys), std::end(kStructuredOutputsKeys),
                     [&](const auto& k) { return key == k.first; });
    if (known != std::end(kStructuredOutputsKeys)) {
      if (auto e = add_spec(known->second, v, field, c)) return e;
    } else if (key == "json_object") {
      if (!v.is_boolean()) return bad_request("'" + field + "' must be a boolean", field);
      if (v == true) {
        if (auto e = c.add({GrammarKind::kJsonObject}, field)) return e;
      }
    } else if (key == "disable_any_whitespace") {
      if (!v.is_boolean()) return bad_request("'" + field + "' must be a boolean", field);
      disable_any_whitespace = v.get<bool>();
    } else if (key == "disable_fallback") {
      // vLLM's switch between grammar backends: this server has one, so it changes nothing.
    } else if (key == "disable_additional_properties") {
      if (v != false)
        return bad_request("'" + field +
                               "' is not supported: say additionalProperties: false in "
                               "the schema",
                           field);
    } else if (key == "whitespace_pattern") {
      return bad_request("'" + field + "' is not supported (use disable_any_whitespace)", field);
    } else if (key == "structural_tag") {
      return bad_request("'" + field + "' is not supported", field);
    } else {
      return bad_request("'" + field + "' is not a structured-output option", field);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> forced_tool_grammar(const Json& tools, const std::string& name,
                                            std::optional<GrammarSpec>& out) {
  if (!tools.is_array() || tools.empty())
    return bad_request("a forced 'tool_choice' needs 'tools'", "tool_choice");
  Json options = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return bad_request("'tools[" + std::to_string(i) + "]' is not a function tool", "tools");
    const std::string fname = (*fn)["name"].get<std::string>();
    if (!name.empty() && fname != name) continue;
    // A function without parameters takes an empty object.
    Json params = fn->contains("parameters") && !(*fn)["parameters"].is_null()
                      ? (*fn)["parameters"]
                      : Json{{"type", "object"}, {"properties", Json::object()}};
    std::string checked;
    if (auto e =
            schema_text(params, "tools[" + std::to_string(i) + "].function.parameters", checked))
      return e;
    if (!name.empty()) {
      out = GrammarSpec{GrammarKind::kJsonSchema, checked};
      return std::nullopt;
    }
    options.push_back({{"type", "object"},
                       {"properties", {{"name", {{"const", fname}}}, {"parameters", params}}},
                       {"required", {"name", "parameters"}},
                       {"additionalProperties", false}});
  }
  if (!name.empty())
    return bad_request("'tool_choice' names the function '" + name + "', which 'tools' lacks",
                       "tool_choice");
  const Json list = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", options}}}};
  out = GrammarSpec{GrammarKind::kJsonSchema, list.dump(-1, ' ', false, kReplace)};
  return std::nullopt;
}

std::optional<ApiError> parse_structured_output(const Json& b, std::optional<GrammarSpec>& out) {
  Collector c;
  bool disable_any_whitespace = false;
  if (b.contains("response_format") && !b["response_format"].is_null()) {
    if (auto e = parse_response_format(b["response_format"], c)) return e;
  }
  if (auto e = parse_vllm_fields(b, c)) return e;
  if (b.contains("structured_outputs")) {
    if (auto e = parse_structured_outputs(b["structured_outputs"], c, disable_any_whitespace))
      return e;
  }
  out = std::move(c.spec());
  if (out) out->any_whitespace = !disable_any_whitespace;
  return std::nullopt;
}

}  // namespace pagellm::server
