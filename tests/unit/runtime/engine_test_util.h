// Engine test helpers shared by the CPU engine tests (tests/unit/runtime) and the GPU ones
// (tests/model): collecting a request's output events (per-sequence tokens and logprobs with the
// top alternatives, finish reasons, the final event), waiting for requests to finish, and making
// greedy requests over random prompts.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace pagellm {

struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;  // per sequence
  std::map<int32_t, std::vector<float>> logprobs;
  std::map<int32_t, std::vector<LogprobsResult>> details;  // with the top alternatives
  std::map<int32_t, FinishReason> finish;
  std::vector<LogprobsResult> prompt_logprobs;
  EngineOutput done;
};

class Waiter {
 public:
  OutputCallback callback(Collected* c) {
    return [this, c](EngineOutput&& o) {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < o.token_ids.size(); ++i) {
        c->tokens[o.seq_index].push_back(o.token_ids[i]);
        if (i < o.logprobs.size()) {
          c->logprobs[o.seq_index].push_back(o.logprobs[i].logprob);
          c->details[o.seq_index].push_back(o.logprobs[i]);
        }
      }
      if (!o.prompt_logprobs.empty()) c->prompt_logprobs = o.prompt_logprobs;
      if (o.finish != FinishReason::kNone && !o.request_done) c->finish[o.seq_index] = o.finish;
      if (o.request_done) {
        c->done = std::move(o);
        ++n_done_;
        cv_.notify_all();
      }
    };
  }
  void wait(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(120), [&] { return n_done_ >= n; }))
        << "requests did not finish";
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_done_ = 0;
};

// A greedy request for token ids (no text), ignoring EOS, with `logprobs` top alternatives.
inline EngineRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens,
                                    int32_t logprobs = 0) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = logprobs;
  r.params.ignore_eos = true;
  r.detokenize = false;
  return r;
}

// `len` token ids in [3, 255], inside every test model's vocabulary and clear of special ids.
inline std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::uniform_int_distribution<int32_t> d(3, 255);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = d(rng);
  return p;
}

// Every prompt as a greedy request of max_tokens (with the top `logprobs` of each token): first
// one request at a time on `alone_engine`, then all at once on `together_engine` (a small token
// budget there makes steps that mix decodes, chunked prefills and new prompts). Returns
// {alone, together}, per request.
inline std::pair<std::vector<Collected>, std::vector<Collected>> run_alone_and_together(
    Engine& alone_engine, Engine& together_engine, const std::vector<std::vector<int32_t>>& prompts,
    int32_t max_tokens, int32_t logprobs = 0) {
  const size_t n = prompts.size();
  std::vector<Collected> alone(n), together(n);
  for (size_t i = 0; i < n; ++i) {
    Waiter w;
    EXPECT_TRUE(
        alone_engine.submit(greedy_request(prompts[i], max_tokens, logprobs), w.callback(&alone[i]))
            .ok());
    w.wait(1);
  }
  Waiter w;
  for (size_t i = 0; i < n; ++i)
    EXPECT_TRUE(
        together_engine
            .submit(greedy_request(prompts[i], max_tokens, logprobs), w.callback(&together[i]))
            .ok());
  w.wait(static_cast<int>(n));
  return {std::move(alone), std::move(together)};
}

}  // namespace pagellm
