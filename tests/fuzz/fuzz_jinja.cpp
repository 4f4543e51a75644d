// libFuzzer target: the input is a chat template's source, rendered against a fixed conversation
// (system/user/assistant/tool messages, a tool call, tools). Parsing and rendering must return a
// Status for every input: no crash, no sanitizer report, no hang (the render limits are small so
// each input finishes quickly), and never an internal error (which would mean an unexpected C++
// exception escaped the interpreter's own error paths).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/jinja/template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi \u00e9 \ud83d\ude00"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call12345", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [1.5, null]}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return kContext;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = pagellm::jinja::Template::parse(source);
  if (!tmpl.ok()) {
    if (tmpl.status().code() == pagellm::StatusCode::kInternal) {
      std::fprintf(stderr, "internal error: %s\n", tmpl.status().message().c_str());
      std::abort();
    }
    return 0;
  }
  pagellm::jinja::RenderLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  auto out = tmpl->render(context(), limits);
  if (!out.ok() && out.status().code() == pagellm::StatusCode::kInternal) {
    std::fprintf(stderr, "internal error: %s\n", out.status().message().c_str());
    std::abort();
  }
  return 0;
}
