#include "tokenizer/jinja/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pagellm {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

Result<std::string> read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return not_found(p.string() + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return data_loss(p.string() + ": read error");
  return ss.str();
}

// A special token is a string or an AddedToken-like {"content": "..."}; null means none.
Result<std::string> token_field(const Json& cfg, const char* key, const std::string& origin) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::string();
  const Json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return invalid_argument(origin + ": field '" + key + "' must be a string or {\"content\": string}");
}

}  // namespace

Result<ChatTemplateSource> parse_tokenizer_config(const std::string& json_text, const std::string& origin) {
  Json cfg = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument(origin + ": not a JSON object");
  ChatTemplateSource out;
  out.origin = origin;
  PAGELLM_ASSIGN_OR_RETURN(out.bos_token, token_field(cfg, "bos_token", origin));
  PAGELLM_ASSIGN_OR_RETURN(out.eos_token, token_field(cfg, "eos_token", origin));
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) {
    return not_found(origin + ": no field 'chat_template'");
  }
  const Json& t = cfg["chat_template"];
  if (t.is_string()) {
    out.source = t.get<std::string>();
    return out;
  }
  if (t.is_array()) {
    for (const Json& entry : t) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
          !entry["template"].is_string()) {
        return invalid_argument(origin + ": field 'chat_template' list entries must be {name, template} strings");
      }
      if (entry["name"] == "default") {
        out.source = entry["template"].get<std::string>();
        return out;
      }
    }
    return not_found(origin + ": field 'chat_template' has no template named 'default'");
  }
  return invalid_argument(origin + ": field 'chat_template' must be a string or a list of {name, template}");
}

Result<ChatTemplateSource> load_chat_template(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const fs::path cfg_path = dir / "tokenizer_config.json";
  const fs::path jinja_path = dir / "chat_template.jinja";
  ChatTemplateSource out;
  bool have_cfg = false;
  if (fs::exists(cfg_path)) {
    PAGELLM_ASSIGN_OR_RETURN(std::string text, read_text(cfg_path));
    auto parsed = parse_tokenizer_config(text, cfg_path.string());
    if (parsed.ok()) {
      out = std::move(*parsed);
      have_cfg = true;
    } else if (parsed.status().code() != StatusCode::kNotFound || !fs::exists(jinja_path)) {
      return parsed.status();
    } else {
      // No template in the config, but a chat_template.jinja: still take the special tokens.
      Json cfg = Json::parse(text, nullptr, false);
      PAGELLM_ASSIGN_OR_RETURN(out.bos_token, token_field(cfg, "bos_token", cfg_path.string()));
      PAGELLM_ASSIGN_OR_RETURN(out.eos_token, token_field(cfg, "eos_token", cfg_path.string()));
    }
  }
  if (fs::exists(jinja_path)) {
    PAGELLM_ASSIGN_OR_RETURN(out.source, read_text(jinja_path));
    out.origin = jinja_path.string();
    return out;
  }
  if (!have_cfg) return not_found(model_dir + ": neither tokenizer_config.json nor chat_template.jinja found");
  return out;
}

Result<ChatTemplate> ChatTemplate::create(const ChatTemplateSource& src) {
  auto t = jinja::Template::parse(src.source);
  if (!t.ok()) {
    return Status(t.status().code(), (src.origin.empty() ? "" : src.origin + ": ") + t.status().message());
  }
  ChatTemplate ct;
  ct.template_ = std::move(*t);
  ct.bos_token_ = src.bos_token;
  ct.eos_token_ = src.eos_token;
  return ct;
}

Result<std::string> ChatTemplate::apply(const ChatRequest& request, const jinja::RenderLimits& limits) const {
  if (!request.messages.is_array()) return invalid_argument("chat template: 'messages' must be a list");
  if (!request.tools.is_null() && !request.tools.is_array()) return invalid_argument("chat template: 'tools' must be a list");
  if (!request.extra.is_object()) return invalid_argument("chat template: extra template arguments must be an object");
  // The variables transformers' apply_chat_template passes, in its order; extra kwargs override.
  Json ctx = Json::object();
  ctx["messages"] = request.messages;
  ctx["tools"] = request.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = request.add_generation_prompt;
  ctx["bos_token"] = bos_token_;
  ctx["eos_token"] = eos_token_;
  for (const auto& [k, v] : request.extra.items()) ctx[k] = v;
  return template_.render(ctx, limits);
}

}  // namespace pagellm
