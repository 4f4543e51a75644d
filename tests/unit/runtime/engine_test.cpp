// Engine tests on a tiny random Llama (tests/data/golden/llama) on the CPU backend: batch
// invariance, prefix caching, n > 1, seeded sampling, aborts freeing every block, bad requests.
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "backend/backend.h"
#include "engine_test_util.h"
#include "io/weights.h"
#include "source_dir.h"

namespace pagellm {
namespace {

class EngineTest : public testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::move(*ckpt);
    backend_ = make_cpu_backend();
    auto m = load_model(ckpt_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
  }

  std::unique_ptr<Engine> make_engine(int32_t max_num_seqs = 64, int32_t budget = 64,
                                      int64_t kv_bytes = 0) {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = max_num_seqs;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.kv_cache_memory = kv_bytes ? kv_bytes : 4 << 20;
    cfg.scheduler.paranoid = true;
    auto e = Engine::create(*model_, *backend_, nullptr, cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static EngineRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
    return greedy_request(std::move(prompt), max_tokens);
  }

  LoadedCheckpoint ckpt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(EngineTest, BatchInvariance32Concurrent) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 32; ++i) prompts.push_back(random_prompt(rng, 3 + (i * 5) % 37));
  // Alone, one at a time; then all 32 at once, with a small token budget so prefills are
  // chunked and mixed with decodes.
  auto solo = make_engine();
  auto e = make_engine(/*max_num_seqs=*/32, /*budget=*/48);
  ASSERT_TRUE(solo != nullptr && e != nullptr);
  auto [alone, together] = run_alone_and_together(*solo, *e, prompts, 12);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(together[i].tokens[0], alone[i].tokens[0]) << "request " << i;
    ASSERT_EQ(together[i].logprobs[0].size(), alone[i].logprobs[0].size());
    for (size_t k = 0; k < alone[i].logprobs[0].size(); ++k)
      EXPECT_NEAR(together[i].logprobs[0][k], alone[i].logprobs[0][k], 1e-4) << i << " " << k;
    EXPECT_EQ(together[i].finish[0], FinishReason::kLength);
    EXPECT_EQ(together[i].done.completion_tokens, 12);
  }
  EXPECT_EQ(e->stats().scheduler.kv_usage, 0.0);
}

TEST_F(EngineTest, PrefixCacheReusesFullBlocksWithSameLogprobs) {
  std::mt19937 rng(11);
  const auto prompt = random_prompt(rng, 40);  // 2 full blocks of 16 + 8
  auto e = make_engine();
  Collected first, second;
  Waiter w;
  ASSERT_TRUE(e->submit(greedy(prompt, 6), w.callback(&first)).ok());
  w.wait(1);
  ASSERT_TRUE(e->submit(greedy(prompt, 6), w.callback(&second)).ok());
  w.wait(2);
  EXPECT_EQ(first.done.cached_tokens, 0);
  EXPECT_EQ(second.done.cached_tokens, 32);  // only the last, partial block is computed again
  EXPECT_EQ(first.tokens[0], second.tokens[0]);
  for (size_t k = 0; k < first.logprobs[0].size(); ++k)
    EXPECT_NEAR(first.logprobs[0][k], second.logprobs[0][k], 1e-4);
  const auto st = e->stats().scheduler.prefix;
  EXPECT_EQ(st.hits, 32);
  EXPECT_EQ(st.queries, 80);
}

TEST_F(EngineTest, PromptLogprobsMatchAcrossChunkSizes) {
  std::mt19937 rng(5);
  const auto prompt = random_prompt(rng, 45);
  std::vector<std::vector<float>> runs;
  for (int budget : {7, 64}) {
    auto e = make_engine(4, budget);
    EngineRequest r = greedy(prompt, 2);
    r.params.prompt_logprobs = 0;
    Collected c;
    Waiter w;
    ASSERT_TRUE(e->submit(r, w.callback(&c)).ok());
    w.wait(1);
    ASSERT_EQ(c.prompt_logprobs.size(), prompt.size() - 1);
    std::vector<float> v;
    for (const auto& x : c.prompt_logprobs) v.push_back(x.logprob);
    runs.push_back(v);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_NEAR(runs[0][i], runs[1][i], 1e-4) << i;
}

// Every step counts: a prompt of one step, then a step per further token. The host's own part
// (scheduling, packing, handling tokens; not the forward or the sampling) is within the steps'
// time, and here (the CPU runs the forward inside the step) well below it.
TEST_F(EngineTest, StepStatsCountHostWorkWithinBusyTime) {
  std::mt19937 rng(13);
  auto e = make_engine();
  ASSERT_NE(e, nullptr);
  Collected out;
  Waiter w;
  ASSERT_TRUE(e->submit(greedy(random_prompt(rng, 20), 5), w.callback(&out)).ok());
  w.wait(1);
  // The stats are published at the end of the step whose event ended the request.
  EngineStats st = e->stats();
  for (int i = 0; i < 500 && st.steps < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = e->stats();
  }
  EXPECT_EQ(st.steps, 5);
  EXPECT_EQ(st.generation_tokens_total, 5);
  EXPECT_GT(st.busy_seconds, 0.0);
  EXPECT_GT(st.host_seconds, 0.0);
  EXPECT_LT(st.host_seconds, st.busy_seconds);
}

TEST_F(EngineTest, SeededSamplingReproducibleAndNSharesPrompt) {
  std::mt19937 rng(3);
  const auto prompt = random_prompt(rng, 20);
  EngineRequest r = greedy(prompt, 10);
  r.params.temperature = 0.9f;
  r.params.top_p = 0.95f;
  r.params.seed = 42;
  r.params.n = 4;
  auto e = make_engine();
  Collected a, b;
  Waiter w;
  ASSERT_TRUE(e->submit(r, w.callback(&a)).ok());
  ASSERT_TRUE(e->submit(r, w.callback(&b)).ok());
  w.wait(2);
  ASSERT_EQ(a.tokens.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "sequence " << i;
    EXPECT_EQ(a.tokens[i].size(), 10u);
  }
  // Different sequences of one request draw differently (4 identical 10-token samples from a
  // peaked-but-not-degenerate distribution would be a seeding bug).
  EXPECT_FALSE(a.tokens[0] == a.tokens[1] && a.tokens[1] == a.tokens[2] && a.tokens[2] == a.tokens[3]);
  EXPECT_EQ(a.done.completion_tokens, 40);
  EXPECT_EQ(e->stats().scheduler.kv_usage, 0.0);
}

TEST_F(EngineTest, AbortsFreeEveryBlock) {
  std::mt19937 rng(9);
  auto e = make_engine(16, 32);
  std::vector<Collected> cs(40);
  Waiter w;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) {
    // 40 tokens each: far longer than the abort below takes to land, so every aborted request is
    // still live when its abort arrives (queued, mid-prefill or mid-decode).
    auto id = e->submit(greedy(random_prompt(rng, 5 + i % 19), 40), w.callback(&cs[i]));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    if (i % 2 == 0) e->abort(*id);
  }
  w.wait(40);
  int n_aborted = 0, n_complete = 0;
  for (int i = 0; i < 40; ++i) {
    if (cs[i].done.finish == FinishReason::kAbort) {
      ++n_aborted;
      EXPECT_EQ(i % 2, 0) << "request " << i << " was not aborted";
    } else {
      ++n_complete;
      EXPECT_EQ(cs[i].tokens[0].size(), 40u) << "request " << i;
    }
  }
  EXPECT_GE(n_aborted, 15);
  EXPECT_EQ(n_complete + n_aborted, 40);
  const auto st = e->stats().scheduler;
  EXPECT_EQ(st.kv_usage, 0.0);
  EXPECT_EQ(st.n_running, 0);
  EXPECT_EQ(st.n_waiting, 0);
  EXPECT_TRUE(e->idle());
}

TEST_F(EngineTest, BadRequestsAreRefused) {
  auto e = make_engine();
  Collected c;
  Waiter w;
  EXPECT_FALSE(e->submit(greedy({}, 4), w.callback(&c)).ok());
  EXPECT_FALSE(e->submit(greedy({1, 2, 999}, 4), w.callback(&c)).ok());
  auto too_long = e->submit(greedy(std::vector<int32_t>(60, 5), 10), w.callback(&c));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("60"), std::string::npos);
  EngineRequest r = greedy({5, 6}, 4);
  r.params.temperature = -1;
  EXPECT_FALSE(e->submit(r, w.callback(&c)).ok());
  r = greedy({5, 6}, 4);
  r.detokenize = true;  // no tokenizer in this engine
  EXPECT_FALSE(e->submit(r, w.callback(&c)).ok());
}

}  // namespace
}  // namespace pagellm
