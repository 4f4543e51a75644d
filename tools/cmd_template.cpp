// pagellm template: render a checkpoint's chat template the way transformers' apply_chat_template
// does, and print the prompt exactly (no newline added).
//   pagellm template --model DIR|FILE.gguf --messages FILE.json [--add-generation-prompt]
// FILE.json holds either a list of messages or an object {"messages": [...], "tools": [...],
// "add_generation_prompt": bool, ...any other template kwargs}.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/serving_model.h"
#include "tokenizer/jinja/chat_template.h"
#include "tools/args.h"

namespace pagellm::cli {

namespace {

using Json = nlohmann::ordered_json;

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagellm template: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int run_template(int argc, char** argv) {
  Args args(
      "template",
      "Renders a checkpoint's chat template as transformers' apply_chat_template does and prints\n"
      "the prompt exactly (no newline added).",
      {{"Input",
        {{"model", "DIR|FILE.gguf", "the checkpoint whose chat template to render"},
         {"messages", "FILE.json",
          "a list of messages, or an object {\"messages\": [...], \"tools\": [...], "
          "\"add_generation_prompt\": bool, ...any other template kwargs}"},
         {"add-generation-prompt", "", "end with the assistant turn's opening"}}}});
  if (auto rc = parse_command_line(args, argc, argv)) return *rc;
  const auto model = args.get("model");
  const auto messages_path = args.get("messages");
  if (!model || !messages_path) return fail("--model and --messages are required (see --help)");

  auto src = load_any_chat_template(*model);
  if (!src.ok()) return fail(src.status().message());
  auto tmpl = ChatTemplate::create(*src);
  if (!tmpl.ok()) return fail(tmpl.status().message());

  std::ifstream f(*messages_path, std::ios::binary);
  if (!f) return fail(*messages_path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  Json doc = Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail(*messages_path + ": not valid JSON");

  ChatRequest req;
  if (doc.is_array()) {
    req.messages = doc;
  } else if (doc.is_object() && doc.contains("messages")) {
    for (const auto& [k, v] : doc.items()) {
      if (k == "messages")
        req.messages = v;
      else if (k == "tools")
        req.tools = v;
      else if (k == "add_generation_prompt" && v.is_boolean())
        req.add_generation_prompt = v.get<bool>();
      else
        req.extra[k] = v;
    }
  } else {
    return fail(*messages_path + ": expected a list of messages or an object with 'messages'");
  }
  if (args.flag("add-generation-prompt")) req.add_generation_prompt = true;

  auto out = tmpl->apply(req);
  if (!out.ok()) return fail(out.status().message());
  std::fwrite(out->data(), 1, out->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace pagellm::cli
