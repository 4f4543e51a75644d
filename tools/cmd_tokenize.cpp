// pagellm tokenize / detokenize: the tokenizer on JSON lines, for scripts and conformance checks.
//   pagellm tokenize   --model DIR --jsonl FILE [--no-special]   one JSON string in, one id array
//   out pagellm detokenize --model DIR --jsonl FILE [--skip-special] one id array in, one JSON
//   string out
// DIR is a folder with tokenizer.json (+ tokenizer_config.json) or tokenizer.model, a .gguf file,
// or a folder holding one; without --model the default model is used. FILE "-" reads stdin.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/default_model.h"
#include "tokenizer/tokenizer.h"
#include "tools/args.h"

namespace pagellm::cli {

namespace {

using nlohmann::json;

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagellm: %s\n", msg.c_str());
  return 1;
}

// Runs `fn(line, line_no)` over the lines of `path` ("-": stdin); stops at the first error.
template <typename Fn>
int for_each_line(const std::string& path, Fn fn) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) return fail(path + ": cannot open");
    in = &file;
  }
  std::string line;
  size_t line_no = 0;
  while (std::getline(*in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    Status st = fn(line, line_no);
    if (!st.ok()) return fail(path + ":" + std::to_string(line_no) + ": " + st.message());
  }
  return 0;
}

int run(int argc, char** argv, bool tokenize) {
  const Option model_option{"model", "DIR|FILE.gguf", "the checkpoint whose tokenizer to use",
                            std::nullopt, "the default model"};
  Args args =
      tokenize
          ? Args("tokenize",
                 "Text to token ids: one JSON string per line in, one id array per line out.",
                 {{"Input",
                   {model_option,
                    {"jsonl", "FILE", "the input, one JSON string per line (- for stdin)"},
                    {"no-special", "", "do not add the tokenizer's special tokens (BOS)"}}}})
          : Args("detokenize",
                 "Token ids to text: one JSON id array per line in, one JSON string per line out.",
                 {{"Input",
                   {model_option,
                    {"jsonl", "FILE", "the input, one JSON array of ids per line (- for stdin)"},
                    {"skip-special", "", "leave special tokens out of the text"}}}});
  if (auto rc = parse_command_line(args, argc, argv)) return *rc;
  const auto jsonl = args.get("jsonl");
  if (!jsonl) return fail("--jsonl FILE is required (see --help)");
  const std::string model = args.has("model") ? args.str("model") : default_model_path();
  auto tok = load_tokenizer(model);
  if (!tok.ok()) return fail(tok.status().to_string());
  const Tokenizer& t = **tok;
  if (tokenize) {
    const bool add_special = !args.flag("no-special");
    return for_each_line(*jsonl, [&](const std::string& line, size_t) -> Status {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string())
        return invalid_argument("expected one JSON string per line");
      auto ids = t.encode(j.get_ref<const std::string&>(), add_special);
      if (!ids.ok()) return ids.status();
      std::fputs(json(*ids).dump().c_str(), stdout);
      std::fputc('\n', stdout);
      return Status();
    });
  }
  const bool skip = args.flag("skip-special");
  return for_each_line(*jsonl, [&](const std::string& line, size_t) -> Status {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_array())
      return invalid_argument("expected one JSON array of ids per line");
    std::vector<int32_t> ids;
    for (const auto& e : j) {
      if (!e.is_number_integer()) return invalid_argument("ids must be integers");
      const int64_t v = e.get<int64_t>();
      if (v < 0 || v >= t.vocab_size()) {
        return out_of_range("id " + std::to_string(v) + " is outside the vocabulary (size " +
                            std::to_string(t.vocab_size()) + ")");
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    auto text = t.decode(ids, skip);
    if (!text.ok()) return text.status();
    // Decoded text is valid UTF-8; replace-on-error keeps the dump total anyway.
    std::fputs(json(*text).dump(-1, ' ', false, json::error_handler_t::replace).c_str(), stdout);
    std::fputc('\n', stdout);
    return Status();
  });
}

}  // namespace

int run_tokenize(int argc, char** argv) {
  return run(argc, argv, true);
}
int run_detokenize(int argc, char** argv) {
  return run(argc, argv, false);
}

}  // namespace pagellm::cli
