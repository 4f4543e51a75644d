// Speculative decoding with the n-gram proposer on the tiny random Llama (tests/data/golden/llama),
// CPU reference backend (its logits do not depend on how a step batches tokens, so outputs can be
// compared exactly): every request's tokens, logprobs, text and finish reasons equal those of the
// same requests without speculation, greedy and sampled (seeded, top-k/top-p/min-p, penalties,
// logit bias, min_tokens, n > 1), with stop strings and stop tokens, max_tokens, prefix caching
// and a KV cache small enough to preempt; and guesses were verified and found right.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "byte_tokenizer.h"
#include "engine_test_util.h"
#include "io/weights.h"
#include "runtime/engine.h"
#include "source_dir.h"

namespace pagellm {
namespace {

class EngineSpecTest : public testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::move(*ckpt);
    backend_ = make_cpu_backend(false);
    auto m = load_model(ckpt_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
    tok_ = byte_tokenizer();
  }

  // Runs `reqs` together; returns each request's events and the engine's final stats.
  std::vector<Collected> run(const std::vector<EngineRequest>& reqs, bool speculate,
                             EngineStats* stats = nullptr, int64_t kv_bytes = 4 << 20,
                             int32_t budget = 64) {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = 32;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.paranoid = true;
    cfg.kv_cache_memory = kv_bytes;
    if (speculate) {
      cfg.speculative.method = SpeculativeConfig::Method::kNgram;
      cfg.speculative.num_tokens = 4;
      cfg.speculative.ngram = {1, 3};
      cfg.speculative.disable_by_batch_size = 0;
    }
    auto e = Engine::create(*model_, *backend_, tok_.get(), cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::vector<Collected> out(reqs.size());
    if (!e.ok()) return out;
    Waiter w;
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_TRUE((*e)->submit(reqs[i], w.callback(&out[i])).ok());
    w.wait(static_cast<int>(reqs.size()));
    (*e)->shutdown();  // the last step's counts are in once its thread has ended
    if (stats) *stats = (*e)->stats();
    EXPECT_EQ((*e)->stats().scheduler.kv_usage, 0.0);  // every block back
    return out;
  }

  LoadedCheckpoint ckpt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
};

// A prompt that repeats itself, so that prompt lookup has something to find.
std::vector<int32_t> repetitive_prompt(std::mt19937& rng, int period, int len) {
  std::vector<int32_t> base = random_prompt(rng, period), p;
  while (static_cast<int>(p.size()) < len) p.push_back(base[p.size() % base.size()]);
  return p;
}

void expect_same(const std::vector<Collected>& want, const std::vector<Collected>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].finish, want[i].finish);
    EXPECT_EQ(got[i].done.completion_tokens, want[i].done.completion_tokens);
    EXPECT_EQ(got[i].done.error.ok(), want[i].done.error.ok());
    ASSERT_EQ(got[i].details.size(), want[i].details.size());
    for (const auto& [seq, lps] : want[i].details) {
      const auto& g = got[i].details.at(seq);
      ASSERT_EQ(g.size(), lps.size());
      for (size_t k = 0; k < lps.size(); ++k) {
        EXPECT_EQ(g[k].logprob, lps[k].logprob) << "seq " << seq << " token " << k;
        EXPECT_EQ(g[k].rank, lps[k].rank);
        ASSERT_EQ(g[k].top.size(), lps[k].top.size());
        for (size_t j = 0; j < lps[k].top.size(); ++j)
          EXPECT_EQ(g[k].top[j].token, lps[k].top[j].token);
      }
    }
  }
}

TEST_F(EngineSpecTest, GreedyOutputsAreUnchanged) {
  std::mt19937 rng(3);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r = greedy_request(repetitive_prompt(rng, 3 + i % 4, 12 + i), 44 - i, 2);
    r.detokenize = false;
    // The random model writes noise, which prompt lookup cannot guess; a strong bias makes half
    // the requests repeat a token, which it can.
    if (i % 2 == 0) r.params.logit_bias = {{17 + i, 30.0f}};
    reqs.push_back(std::move(r));
  }
  EngineStats st;
  const auto plain = run(reqs, false);
  const auto spec = run(reqs, true, &st);
  expect_same(plain, spec);
  EXPECT_GT(st.spec_drafts, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0) << "no guess was right: the test shows nothing";
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);  // and some were wrong
  EXPECT_GT(st.spec_accepted_tokens, st.spec_draft_tokens / 3);
  int64_t by_position = 0;
  for (int64_t n : st.spec_accepted_per_position) by_position += n;
  EXPECT_EQ(by_position, st.spec_accepted_tokens);
  EXPECT_EQ(st.spec_accepted_per_position.size(), 4u);
  int64_t n_tokens = 0;
  for (const Collected& c : plain) n_tokens += c.done.completion_tokens;
  EXPECT_EQ(st.generation_tokens_total, n_tokens);
}

TEST_F(EngineSpecTest, SampledOutputsAreUnchanged) {
  std::mt19937 rng(5);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    r.prompt = repetitive_prompt(rng, 2 + i % 5, 10 + i);
    r.detokenize = false;
    SamplingParams& p = r.params;
    p.max_tokens = 30;
    p.seed = 100 + i;
    p.ignore_eos = true;
    p.logprobs = i % 3;
    if (i % 2 == 0) p.logit_bias = {{30 + i, 8.0f}};  // repeats, mostly: guesses come right
    // Low temperatures, so that the biased tokens win most draws.
    switch (i % 6) {
      case 0:
        p.temperature = 0.3f;
        break;
      case 1:
        p.temperature = 0.5f, p.top_k = 5, p.top_p = 0.9f;
        break;
      case 2:
        p.temperature = 0.4f, p.min_p = 0.1f;
        break;
      case 3:
        p.temperature = 0.3f, p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f,
        p.presence_penalty = 0.2f;
        break;
      case 4:
        p.temperature = 0.3f, p.n = 3;
        break;
      default:
        p.temperature = 0.3f, p.logit_bias = {{7, 2.0f}, {40, 6.0f}}, p.min_tokens = 6,
        p.stop_token_ids = {9}, p.ignore_eos = false;
        break;
    }
    reqs.push_back(std::move(r));
  }
  EngineStats st;
  const auto plain = run(reqs, false);
  const auto spec = run(reqs, true, &st);
  expect_same(plain, spec);
  EXPECT_GT(st.spec_accepted_tokens, st.spec_draft_tokens / 4);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
}

TEST_F(EngineSpecTest, StopStringsAndMaxTokensCutADraft) {
  std::mt19937 rng(9);
  std::vector<EngineRequest> reqs;
  // Greedy runs of the plain engine first, to pick stop strings that do occur mid-output.
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy_request(repetitive_prompt(rng, 2 + i % 3, 9), 5 + 3 * i);
    r.detokenize = true;  // stop strings match text
    if (i % 3 == 1) r.params.logit_bias = {{65 + i, 30.0f}};
    reqs.push_back(std::move(r));
  }
  const auto first = run(reqs, false);
  for (size_t i = 0; i < reqs.size(); i += 2) {
    const auto& t = first[i].tokens.at(0);
    ASSERT_GE(t.size(), 4u);
    auto s = tok_->decode({t.begin() + 2, t.begin() + 4}, false);
    ASSERT_TRUE(s.ok());
    reqs[i].params.stop = {*s};
    reqs[i].params.include_stop_str_in_output = i % 4 == 0;
  }
  const auto plain = run(reqs, false);
  const auto spec = run(reqs, true);
  expect_same(plain, spec);
  for (size_t i = 0; i < reqs.size(); i += 2)
    EXPECT_EQ(spec[i].finish.at(0), FinishReason::kStop) << "request " << i;
}

TEST_F(EngineSpecTest, PreemptionAndPrefixCachingKeepOutputs) {
  std::mt19937 rng(13);
  std::vector<EngineRequest> reqs;
  const auto shared = repetitive_prompt(rng, 4, 20);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p = shared;  // a common prefix: prefix-cache hits
    p.push_back(10 + i);
    EngineRequest r = greedy_request(p, 30, 1);
    r.detokenize = false;
    if (i % 2 == 0) r.params.logit_bias = {{50 + i, 30.0f}};
    reqs.push_back(std::move(r));
  }
  // A cache of 12 blocks of 16 tokens for 10 requests of up to 51 tokens: preemptions.
  const int64_t kv =
      12 * KvCache::bytes_per_block(model_->kv_spec(), 16, backend_->activation_dtype());
  EngineStats plain_stats, spec_stats;
  const auto plain = run(reqs, false, &plain_stats, kv, 32);
  const auto spec = run(reqs, true, &spec_stats, kv, 32);
  expect_same(plain, spec);
  EXPECT_GT(spec_stats.scheduler.n_preemptions, 0) << "the cache was large enough: no preemption";
  EXPECT_GT(spec_stats.scheduler.prefix.hits, 0);
  EXPECT_GT(spec_stats.spec_accepted_tokens, 0);
}

}  // namespace
}  // namespace pagellm
