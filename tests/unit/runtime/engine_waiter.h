// Collecting an Engine's output events in tests: per-sequence tokens and logprobs (with the top
// alternatives, for margin checks), finish reasons and the final event, and waiting for requests to
// finish. Shared by the CPU engine tests (tests/unit/runtime) and the GPU ones (tests/model).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
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

}  // namespace pagellm
