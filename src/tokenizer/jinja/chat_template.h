// Chat templates of Hugging Face checkpoints: loading (tokenizer_config.json / chat_template.jinja)
// and applying them to an OpenAI-style conversation exactly as transformers' apply_chat_template.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/jinja/template.h"

namespace pagellm {

struct ChatTemplateSource {
  std::string source;     // the Jinja text
  std::string bos_token;  // "" when the checkpoint defines none
  std::string eos_token;
  std::string origin;     // file the template came from, for messages
};

// Reads a model folder: chat_template.jinja if present (as transformers prefers it), else
// tokenizer_config.json's "chat_template" (a string, or a list of {name, template} from which
// "default" is used). bos_token / eos_token come from tokenizer_config.json (a string or
// {"content": ...}). Errors name the file and field.
Result<ChatTemplateSource> load_chat_template(const std::string& model_dir);

// Parses a tokenizer_config.json text (exposed for tests and for GGUF-free callers).
Result<ChatTemplateSource> parse_tokenizer_config(const std::string& json_text, const std::string& origin);

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;                                // null or a list of tool schemas
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // extra template kwargs
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> create(const ChatTemplateSource& src);

  // The prompt text. Errors: invalid_argument (bad messages, template errors and
  // raise_exception messages), resource_exhausted (render limits).
  Result<std::string> apply(const ChatRequest& request, const jinja::RenderLimits& limits = {}) const;

 private:
  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace pagellm
