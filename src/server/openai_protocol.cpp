#include "server/openai_protocol.h"

#include <cmath>
#include <limits>

#include "server/json_scan.h"
#include "server/structured_output.h"

namespace pagellm::server {
namespace {

std::optional<ApiError> type_error(const std::string& field, const char* want, const Json& got) {
  return bad_request("'" + field + "' must be " + want + ", got " + got.type_name(), field);
}

// Field accessors: absent or null leaves `out` untouched.
const Json* find(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_bool(const Json& obj, const char* name, bool& out) {
  const Json* v = find(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return type_error(name, "a boolean", *v);
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_float(const Json& obj, const char* name, float& out) {
  const Json* v = find(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return type_error(name, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 3.0e38) return bad_request("'" + std::string(name) + "' is out of range", name);
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> get_int(const Json& obj, const char* name, int64_t lo, int64_t hi,
                                std::optional<int64_t>& out) {
  const Json* v = find(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    // 3.0 is an integer to a JSON client written in JavaScript.
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= -9.2e18 && d <= 9.2e18) {
        const int64_t x = static_cast<int64_t>(d);
        if (x < lo || x > hi)
          return bad_request("'" + std::string(name) + "' must be in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "], got " + std::to_string(x),
                             name);
        out = x;
        return std::nullopt;
      }
    }
    return type_error(name, "an integer", *v);
  }
  int64_t x;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                     : static_cast<int64_t>(u);
  } else {
    x = v->get<int64_t>();
  }
  if (x < lo || x > hi)
    return bad_request("'" + std::string(name) + "' must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(x),
                       name);
  out = x;
  return std::nullopt;
}

std::optional<ApiError> get_string(const Json& obj, const char* name, std::string& out) {
  const Json* v = find(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) return type_error(name, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> token_id(const Json& v, const std::string& field, int32_t vocab, int32_t& out) {
  if (!v.is_number_integer()) return type_error(field, "an integer token id", v);
  const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                                           : v.get<int64_t>();
  if (x < 0 || (vocab > 0 && x >= vocab))
    return bad_request("'" + field + "' token id " + std::to_string(x) + " is outside the vocabulary [0, " +
                           std::to_string(vocab) + ")",
                       field);
  out = static_cast<int32_t>(x);
  return std::nullopt;
}

std::optional<ApiError> token_list(const Json& v, const std::string& field, int32_t vocab,
                                   std::vector<int32_t>& out) {
  if (!v.is_array()) return type_error(field, "a list of token ids", v);
  out.clear();
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int32_t t = 0;
    if (auto e = token_id(v[i], field + "[" + std::to_string(i) + "]", vocab, t)) return e;
    out.push_back(t);
  }
  return std::nullopt;
}

// Fields shared by completions and chat.
std::optional<ApiError> parse_common(const Json& b, int32_t vocab, GenerateRequest& r) {
  if (auto e = get_string(b, "model", r.model)) return e;
  if (auto e = parse_structured_output(b, r.grammar)) return e;
  SamplingParams& p = r.params;
  if (auto e = get_float(b, "temperature", p.temperature)) return e;
  if (auto e = get_float(b, "top_p", p.top_p)) return e;
  if (auto e = get_float(b, "min_p", p.min_p)) return e;
  if (auto e = get_float(b, "presence_penalty", p.presence_penalty)) return e;
  if (auto e = get_float(b, "frequency_penalty", p.frequency_penalty)) return e;
  if (auto e = get_float(b, "repetition_penalty", p.repetition_penalty)) return e;
  std::optional<int64_t> v;
  if (auto e = get_int(b, "top_k", -1, INT32_MAX, v)) return e;
  if (v) p.top_k = static_cast<int32_t>(*v);
  v.reset();
  if (auto e = get_int(b, "n", 1, kMaxN, v)) return e;
  if (v) p.n = static_cast<int32_t>(*v);
  v.reset();
  if (auto e = get_int(b, "min_tokens", 0, INT32_MAX, v)) return e;
  if (v) p.min_tokens = static_cast<int32_t>(*v);
  v.reset();
  if (auto e = get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), v)) return e;
  if (v) p.seed = static_cast<uint64_t>(*v);
  v.reset();
  if (const Json* bo = find(b, "best_of")) {
    if (!bo->is_number_integer() || bo->get<int64_t>() != p.n)
      return bad_request("'best_of' is not supported (only best_of equal to n)", "best_of");
  }
  if (auto e = get_bool(b, "ignore_eos", p.ignore_eos)) return e;
  if (auto e = get_bool(b, "include_stop_str_in_output", p.include_stop_str_in_output)) return e;
  if (auto e = get_bool(b, "stream", r.stream)) return e;
  if (auto e = get_bool(b, "skip_special_tokens", r.skip_special_tokens)) return e;
  if (auto e = get_bool(b, "return_token_ids", r.return_token_ids)) return e;
  if (auto e = get_string(b, "user", r.user)) return e;
  if (const Json* so = find(b, "stream_options")) {
    if (!so->is_object()) return type_error("stream_options", "an object", *so);
    if (!r.stream) return bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (const Json* iu = find(*so, "include_usage")) {
      if (!iu->is_boolean()) return type_error("stream_options.include_usage", "a boolean", *iu);
      r.include_usage = iu->get<bool>();
    }
  }
  if (const Json* s = find(b, "stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) return type_error("stop[" + std::to_string(i) + "]", "a string", (*s)[i]);
        p.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      return type_error("stop", "a string or a list of strings", *s);
    }
    for (const auto& st : p.stop)
      if (st.empty()) return bad_request("'stop' strings must not be empty", "stop");
  }
  if (const Json* s = find(b, "stop_token_ids")) {
    if (auto e = token_list(*s, "stop_token_ids", vocab, p.stop_token_ids)) return e;
  }
  if (const Json* lb = find(b, "logit_bias")) {
    if (!lb->is_object()) return type_error("logit_bias", "an object of token id -> bias", *lb);
    for (const auto& [k, val] : lb->items()) {
      char* end = nullptr;
      errno = 0;
      const long long t = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end || errno || t < 0 || (vocab > 0 && t >= vocab))
        return bad_request("'logit_bias' key '" + k + "' is not a token id in [0, " + std::to_string(vocab) + ")",
                           "logit_bias");
      if (!val.is_number()) return type_error("logit_bias." + k, "a number", val);
      p.logit_bias.push_back({static_cast<int32_t>(t), static_cast<float>(val.get<double>())});
    }
  }
  if (Status s = p.validate(vocab); !s.ok()) {
    // "sampling params: 'top_p' must be in (0, 1], got 1.5" -> param top_p.
    std::string param;
    const auto q1 = s.message().find('\'');
    if (q1 != std::string::npos) {
      const auto q2 = s.message().find('\'', q1 + 1);
      if (q2 != std::string::npos) param = s.message().substr(q1 + 1, q2 - q1 - 1);
    }
    return bad_request(s.message(), param);
  }
  return std::nullopt;
}

std::optional<ApiError> parse_max_tokens(const Json& b, const char* name, SamplingParams& p) {
  std::optional<int64_t> v;
  if (auto e = get_int(b, name, 1, INT32_MAX, v)) return e;
  if (v) p.max_tokens = static_cast<int32_t>(*v);
  return std::nullopt;
}

// One chat message as the template wants it: content parts joined, tool-call arguments parsed.
std::optional<ApiError> normalize_message(const Json& m, size_t i, Json& out) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return type_error(at, "an object", m);
  out = Json::object();
  const Json* role = find(m, "role");
  if (!role || !role->is_string()) return bad_request("'" + at + ".role' must be a string", at + ".role");
  std::string r = role->get<std::string>();
  if (r == "developer") r = "system";  // OpenAI's newer name for the system role
  if (r != "system" && r != "user" && r != "assistant" && r != "tool")
    return bad_request("'" + at + ".role' must be system, developer, user, assistant or tool, got '" +
                           r + "'",
                       at + ".role");
  out["role"] = r;
  const Json* c = find(m, "content");
  if (!c) {
    if (r != "assistant") return bad_request("'" + at + ".content' is required", at + ".content");
    out["content"] = nullptr;
  } else if (c->is_string()) {
    out["content"] = *c;
  } else if (c->is_array()) {
    std::string text;
    for (size_t k = 0; k < c->size(); ++k) {
      const Json& part = (*c)[k];
      const std::string pat = at + ".content[" + std::to_string(k) + "]";
      if (!part.is_object()) return type_error(pat, "an object", part);
      const Json* type = find(part, "type");
      if (!type || !type->is_string() || (*type != "text" && *type != "input_text"))
        return bad_request("'" + pat + ".type' must be 'text' (only text content is supported)", pat + ".type");
      const Json* t = find(part, "text");
      if (!t || !t->is_string()) return bad_request("'" + pat + ".text' must be a string", pat + ".text");
      if (!text.empty()) text += '\n';
      text += t->get<std::string>();
    }
    out["content"] = text;
  } else {
    return type_error(at + ".content", "a string or a list of text parts", *c);
  }
  for (const char* key : {"name", "tool_call_id"}) {
    if (const Json* v = find(m, key)) {
      if (!v->is_string()) return type_error(at + "." + key, "a string", *v);
      out[key] = *v;
    }
  }
  if (const Json* tc = find(m, "tool_calls")) {
    if (!tc->is_array()) return type_error(at + ".tool_calls", "a list", *tc);
    Json calls = Json::array();
    for (const Json& call : *tc) {
      Json c2 = call;
      // Templates index arguments as a mapping; OpenAI sends them as a JSON string.
      if (c2.is_object() && c2.contains("function") && c2["function"].is_object()) {
        Json& fn = c2["function"];
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          Json parsed = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = parsed;
        }
      }
      calls.push_back(std::move(c2));
    }
    out["tool_calls"] = std::move(calls);
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const Json& b, Json& out) {
  const Json* m = find(b, "messages");
  if (!m) return bad_request("'messages' is required", "messages");
  if (!m->is_array()) return type_error("messages", "a list", *m);
  if (m->empty()) return bad_request("'messages' must not be empty", "messages");
  out = Json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    Json msg;
    if (auto e = normalize_message((*m)[i], i, msg)) return e;
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_template_extras(const Json& b, Json& tools, Json& kwargs) {
  if (const Json* t = find(b, "tools")) {
    if (!t->is_array()) return type_error("tools", "a list", *t);
    tools = *t;
  }
  if (const Json* k = find(b, "chat_template_kwargs")) {
    if (!k->is_object()) return type_error("chat_template_kwargs", "an object", *k);
    kwargs = *k;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_json_body(const std::string& body, Json& out) {
  // Nesting depth outside strings, so that a hostile body cannot exhaust the parser's stack. Past
  // the first object or array the parser refuses anything but whitespace, without recursing.
  const size_t start = body.find_first_not_of(" \t\r\n");
  if (start != std::string::npos && (body[start] == '{' || body[start] == '[') &&
      json_value_end(body, start, kMaxJsonDepth) == kJsonTooDeep)
    return bad_request("the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels");
  try {
    out = Json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return bad_request(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!out.is_object()) return bad_request(std::string("the request body must be a JSON object, got ") + out.type_name());
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const Json& b, int32_t vocab, GenerateRequest& r) {
  r.chat = false;
  const Json* prompt = find(b, "prompt");
  if (!prompt) return bad_request("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    r.prompts.push_back({prompt->get<std::string>(), {}});
  } else if (prompt->is_array()) {
    if (prompt->empty()) return bad_request("'prompt' must not be empty", "prompt");
    const Json& first = (*prompt)[0];
    if (first.is_number()) {  // one prompt of token ids
      PromptInput in;
      if (auto e = token_list(*prompt, "prompt", vocab, in.ids)) return e;
      r.prompts.push_back(std::move(in));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const Json& item = (*prompt)[i];
        const std::string at = "prompt[" + std::to_string(i) + "]";
        if (item.is_string()) {
          r.prompts.push_back({item.get<std::string>(), {}});
        } else if (item.is_array()) {
          PromptInput in;
          if (auto e = token_list(item, at, vocab, in.ids)) return e;
          if (in.ids.empty()) return bad_request("'" + at + "' must not be empty", "prompt");
          r.prompts.push_back(std::move(in));
        } else {
          return type_error(at, "a string or a list of token ids", item);
        }
      }
    }
  } else {
    return type_error("prompt", "a string, a list of strings, a list of token ids or a list of such lists", *prompt);
  }
  if (const Json* s = find(b, "suffix")) {
    if (!s->is_string() || !s->get<std::string>().empty())
      return bad_request("'suffix' is not supported (no fill-in-the-middle)", "suffix");
  }
  if (auto e = parse_max_tokens(b, "max_tokens", r.params)) return e;
  if (!r.params.max_tokens) r.params.max_tokens = 16;  // OpenAI's completions default
  std::optional<int64_t> lp;
  if (auto e = get_int(b, "logprobs", 0, kMaxLogprobs, lp)) return e;
  if (lp) r.logprobs = static_cast<int32_t>(*lp);
  if (auto e = get_bool(b, "echo", r.echo)) return e;
  if (auto e = get_bool(b, "add_special_tokens", r.add_special_tokens)) return e;
  if (auto e = parse_common(b, vocab, r)) return e;
  if (r.logprobs) r.params.logprobs = r.logprobs;
  if (r.echo && r.logprobs) r.params.prompt_logprobs = r.logprobs;
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(const Json& b, int32_t vocab, GenerateRequest& r) {
  r.chat = true;
  r.add_special_tokens = false;  // the template writes BOS and friends itself
  if (auto e = parse_messages(b, r.messages)) return e;
  if (auto e = parse_template_extras(b, r.tools, r.chat_template_kwargs)) return e;
  if (auto e = get_bool(b, "add_generation_prompt", r.add_generation_prompt)) return e;
  if (const Json* c = find(b, "continue_final_message"); c && *c != false)
    return bad_request("'continue_final_message' is not supported", "continue_final_message");
  if (auto e = parse_max_tokens(b, "max_tokens", r.params)) return e;
  if (auto e = parse_max_tokens(b, "max_completion_tokens", r.params)) return e;  // wins
  bool want_lp = false;
  if (auto e = get_bool(b, "logprobs", want_lp)) return e;
  std::optional<int64_t> top;
  if (auto e = get_int(b, "top_logprobs", 0, kMaxLogprobs, top)) return e;
  if (top && !want_lp) return bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
  if (want_lp) r.logprobs = static_cast<int32_t>(top.value_or(0));
  if (const Json* tc = find(b, "tool_choice")) {
    const Json* fn = tc->is_object() && tc->contains("function") ? &(*tc)["function"] : nullptr;
    if (tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required")) {
      if (*tc == "none") r.tools = nullptr;
      if (*tc == "required") r.forced_tool = std::string();
    } else if (fn && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string()) {
      r.forced_tool = (*fn)["name"].get<std::string>();
    } else {
      return bad_request(
          "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
          "\"function\", \"function\": {\"name\": ...}}",
          "tool_choice");
    }
  }
  if (auto e = parse_common(b, vocab, r)) return e;
  if (r.forced_tool) {
    // Forcing a call is a grammar over the tools' parameter schemas (structured_output.h).
    if (r.grammar)
      return bad_request(
          "a forced 'tool_choice' and a structured-output constraint cannot be "
          "combined",
          "tool_choice");
    if (auto e = forced_tool_grammar(r.tools, *r.forced_tool, r.grammar)) return e;
  }
  if (r.logprobs) r.params.logprobs = r.logprobs;
  return std::nullopt;
}

std::optional<ApiError> parse_tokenize_request(const Json& b, TokenizeRequest& r) {
  if (auto e = get_string(b, "model", r.model)) return e;
  if (auto e = get_bool(b, "add_special_tokens", r.add_special_tokens)) return e;
  if (auto e = get_bool(b, "add_generation_prompt", r.add_generation_prompt)) return e;
  if (auto e = get_bool(b, "return_token_strs", r.return_token_strs)) return e;
  if (find(b, "messages")) {
    if (auto e = parse_messages(b, r.messages)) return e;
    if (auto e = parse_template_extras(b, r.tools, r.chat_template_kwargs)) return e;
    // A chat prompt already carries the template's special tokens.
    if (!find(b, "add_special_tokens")) r.add_special_tokens = false;
    return std::nullopt;
  }
  std::string p;
  const Json* pj = find(b, "prompt");
  if (!pj) return bad_request("give 'prompt' (a string) or 'messages'", "prompt");
  if (auto e = get_string(b, "prompt", p)) return e;
  r.prompt = std::move(p);
  return std::nullopt;
}

std::optional<ApiError> parse_detokenize_request(const Json& b, int32_t vocab, DetokenizeRequest& r) {
  if (auto e = get_string(b, "model", r.model)) return e;
  const Json* t = find(b, "tokens");
  if (!t) return bad_request("'tokens' is required", "tokens");
  return token_list(*t, "tokens", vocab, r.tokens);
}

double json_logprob(float lp) {
  if (std::isnan(lp)) return -9999.0;
  return std::isinf(lp) || lp < -9999.0f ? -9999.0 : static_cast<double>(lp);
}

}  // namespace pagellm::server
