// pagellm generate: one prompt in, one completion out, through the serving engine.
//   pagellm generate "Once upon a time"            (default model, text in, text out)
//   pagellm generate --model DIR --prompt-ids 5,17,42 --max-tokens 24 --temperature 0
//       --prompt-logprobs --logprobs 1 --json              (one command line)
// With --json the last line of stdout is one object: {"prompt_logprobs": [null, ...],
// "token_ids": [...], "logprobs": [...], "text": ...}: natural-log probabilities from the full
// softmax of the model's raw logits; prompt_logprobs[i] = log P(prompt[i] | prompt[:i]).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/serving_model.h"
#include "tools/args.h"
#include "tools/cli_common.h"

namespace pagellm::cli {

int run_generate(int argc, char** argv) {
  Args a(
      "generate",
      "One prompt in, one completion out, through the serving engine.\n"
      "  pagellm generate \"Once upon a time\"            default model, text in, streamed text "
      "out\n"
      "  pagellm generate --model DIR --prompt-ids 5,17,42 --max-tokens 24 --temperature 0 \\\n"
      "      --prompt-logprobs --logprobs 1 --json",
      {model_options(),
       {"Input and output",
        {{"prompt-ids", "IDS", "the prompt as comma-separated token ids instead of text",
          std::nullopt, "the text argument"},
         {"prompt-logprobs", "", "also return log P(prompt[i] | prompt[:i]) for each prompt token"},
         {"json", "",
          "print one JSON object last: prompt_logprobs, token_ids, logprobs (natural log, full "
          "softmax of the raw logits), text"},
         {"no-stream", "", "print the text once at the end instead of token by token"}}},
       sampling_options({.max_tokens = "128"}),
       cache_options(),
       scheduler_options(),
       speculative_options()});
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;
  auto sm = load_model_from_args(a);
  if (!sm.ok()) return fail("generate", sm.status());
  ServingModel& m = **sm;

  auto params = sampling_from_args(a);
  if (!params.ok()) return fail("generate", params.status());
  EngineRequest req;
  req.params = *params;
  auto ids = a.get_int_list("prompt-ids");
  if (!ids.ok()) return fail("generate", ids.status());
  if (!ids->empty()) {
    req.prompt = *ids;
    req.detokenize = m.tokenizer != nullptr;
  } else {
    if (a.positionals().size() != 1)
      return fail(
          "generate",
          invalid_argument("give one prompt: pagellm generate \"text\", or --prompt-ids 5,17,42"));
    if (!m.tokenizer)
      return fail("generate", invalid_argument("this model has no tokenizer: use --prompt-ids"));
    auto enc = m.tokenizer->encode(a.positionals()[0], /*add_special_tokens=*/true);
    if (!enc.ok()) return fail("generate", enc.status());
    req.prompt = std::move(*enc);
  }
  if (a.flag("prompt-logprobs")) req.params.prompt_logprobs = 0;

  auto engine = make_engine_from_args(a, m);
  if (!engine.ok()) return fail("generate", engine.status());

  const bool json = a.flag("json");
  const bool stream_text = !json && req.detokenize && !a.flag("no-stream");
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  EngineOutput last;
  std::vector<int32_t> tokens;
  std::string text;
  nlohmann::json logprobs = nlohmann::json::array(), top = nlohmann::json::array();
  nlohmann::json prompt_lp = nlohmann::json::array({nullptr});
  const auto t0 = std::chrono::steady_clock::now();
  double ttft = 0;
  auto sub = (*engine)->submit(req, [&](EngineOutput&& o) {
    std::lock_guard<std::mutex> lock(mu);
    if (!o.token_ids.empty() && tokens.empty())
      ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    text += o.text;
    if (stream_text && !o.text.empty()) {
      std::fwrite(o.text.data(), 1, o.text.size(), stdout);
      std::fflush(stdout);
    }
    for (const auto& lp : o.logprobs) {
      logprobs.push_back(lp.logprob);
      nlohmann::json t = nlohmann::json::object();
      for (const auto& e : lp.top) t[std::to_string(e.token)] = e.logprob;
      top.push_back(t);
    }
    for (const auto& lp : o.prompt_logprobs) prompt_lp.push_back(lp.logprob);
    if (o.request_done) {
      last = std::move(o);
      done = true;
      cv.notify_all();
    }
  });
  if (!sub.ok()) return fail("generate", sub.status());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!last.error.ok()) return fail("generate", last.error);
  std::fprintf(
      stderr, "\n%zu prompt tokens, %zu generated; first token after %.3f s, %.1f tok/s after it\n",
      req.prompt.size(), tokens.size(), ttft,
      tokens.size() > 1 ? (tokens.size() - 1) / (total - ttft) : 0.0);
  if (json) {
    nlohmann::json j;
    j["token_ids"] = tokens;
    j["logprobs"] = req.params.logprobs ? logprobs : nlohmann::json(nullptr);
    if (req.params.logprobs) j["top_logprobs"] = top;
    j["prompt_logprobs"] = req.params.prompt_logprobs ? prompt_lp : nlohmann::json(nullptr);
    if (req.detokenize) j["text"] = text;
    std::printf("%s\n", j.dump().c_str());
  } else if (!req.detokenize) {
    for (size_t i = 0; i < tokens.size(); ++i) std::printf("%s%d", i ? "," : "", tokens[i]);
    std::printf("\n");
  } else if (!stream_text) {
    std::printf("%s\n", text.c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace pagellm::cli
