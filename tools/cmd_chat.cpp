// pagellm chat: an interactive conversation on the terminal, streamed token by token, with the
// model's own chat template (default model when no --model is given).
//   /reset starts over, /exit (or end of input) quits.
#include <unistd.h>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>

#include "runtime/engine.h"
#include "runtime/serving_model.h"
#include "tools/args.h"
#include "tools/cli_common.h"

namespace pagellm::cli {

int run_chat(int argc, char** argv) {
  Args a("chat",
         "An interactive conversation on the terminal with the model's chat template, streamed\n"
         "token by token. /reset starts over; /exit (or the end of input) quits.",
         {model_options(),
          {"Chat",
           {{"system", "TEXT", "a system message that starts the conversation", std::nullopt,
             "none"}}},
          sampling_options({.temperature = "0.7", .top_p = "0.9"}),
          cache_options(),
          scheduler_options(),
          speculative_options()});
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;
  auto sm = load_model_from_args(a);
  if (!sm.ok()) return fail("chat", sm.status());
  ServingModel& m = **sm;
  if (!m.tokenizer || !m.chat_template)
    return fail("chat", invalid_argument("this model has no tokenizer or chat template"));
  auto params = sampling_from_args(a);
  if (!params.ok()) return fail("chat", params.status());
  auto engine = make_engine_from_args(a, m);
  if (!engine.ok()) return fail("chat", engine.status());

  auto reset = [&] {
    ChatRequest c;
    if (a.has("system")) c.messages.push_back({{"role", "system"}, {"content", a.str("system")}});
    return c;
  };
  ChatRequest chat = reset();
  const bool tty = isatty(0);
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      chat = reset();
      continue;
    }
    if (line.empty()) continue;
    chat.messages.push_back({{"role", "user"}, {"content", line}});
    chat.add_generation_prompt = true;
    auto prompt = m.chat_template->apply(chat);
    if (!prompt.ok()) return fail("chat", prompt.status());
    // The template already holds the special tokens (BOS etc.), as transformers tokenizes it.
    auto ids = m.tokenizer->encode(*prompt, /*add_special_tokens=*/false);
    if (!ids.ok()) return fail("chat", ids.status());
    EngineRequest req;
    req.prompt = std::move(*ids);
    req.params = *params;
    if (req.params.max_tokens && static_cast<int64_t>(req.prompt.size()) + *req.params.max_tokens >
                                     (*engine)->max_model_len())
      req.params.max_tokens.reset();  // whatever room is left
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string reply;
    Status error;
    auto sub = (*engine)->submit(std::move(req), [&](EngineOutput&& o) {
      std::lock_guard<std::mutex> lock(mu);
      if (!o.text.empty()) {
        std::fwrite(o.text.data(), 1, o.text.size(), stdout);
        std::fflush(stdout);
        reply += o.text;
      }
      if (o.request_done) {
        error = o.error;
        done = true;
        cv.notify_all();
      }
    });
    if (!sub.ok()) {
      std::fprintf(stderr, "pagellm chat: %s\n", sub.status().message().c_str());
      chat.messages.erase(chat.messages.end() - 1);
      continue;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    std::printf("\n");
    if (!error.ok()) std::fprintf(stderr, "pagellm chat: %s\n", error.message().c_str());
    chat.messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

}  // namespace pagellm::cli
