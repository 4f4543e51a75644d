// Speculative decoding with the n-gram proposer on the tiny random Llama (tests/data/golden/llama),
// CPU reference backend (its logits do not depend on how a step batches tokens, so outputs can be
// compared exactly): every request's tokens, logprobs, text and finish reasons equal those of the
// same requests without speculation, greedy and sampled (seeded, top-k/top-p/min-p, penalties,
// logit bias, min_tokens, n > 1), with stop strings and stop tokens, max_tokens, prefix caching
// and a KV cache small enough to preempt; and guesses were verified and found right. The same
// for a draft model's greedy requests (the target itself, and another model of the same
// vocabulary); its sampled requests draw their guesses, which the rejection sampler verifies:
// their tokens keep the target's distribution, not its draws.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "byte_tokenizer.h"
#include "engine_test_util.h"
#include "io/weights.h"
#include "runtime/engine.h"
#include "runtime/grammar.h"
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
  // Prompt lookup from 1 to 3 tokens, 4 guesses, at any batch size.
  static SpeculativeConfig ngram() {
    SpeculativeConfig sc;
    sc.method = SpeculativeConfig::Method::kNgram;
    sc.num_tokens = 4;
    sc.ngram = {1, 3};
    sc.disable_by_batch_size = 0;
    return sc;
  }
  static SpeculativeConfig draft(Model& m, int32_t k) {
    SpeculativeConfig sc;
    sc.method = SpeculativeConfig::Method::kDraftModel;
    sc.draft_model = &m;
    sc.num_tokens = k;
    sc.disable_by_batch_size = 0;
    return sc;
  }

  std::vector<Collected> run(const std::vector<EngineRequest>& reqs, bool speculate,
                             EngineStats* stats = nullptr, int64_t kv_bytes = 4 << 20,
                             int32_t budget = 64) {
    return run_with(reqs, speculate ? ngram() : SpeculativeConfig{}, stats, kv_bytes, budget);
  }
  // `model`: the target (null: the Llama).
  std::vector<Collected> run_with(const std::vector<EngineRequest>& reqs,
                                  const SpeculativeConfig& sc, EngineStats* stats = nullptr,
                                  int64_t kv_bytes = 4 << 20, int32_t budget = 64,
                                  Model* model = nullptr) {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = 32;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.paranoid = reqs.size() <= 64;  // its checks walk every block each step
    cfg.scheduler.max_waiting =
        std::max(cfg.scheduler.max_waiting, static_cast<int32_t>(reqs.size()));
    cfg.kv_cache_memory = kv_bytes;
    cfg.speculative = sc;
    auto e = Engine::create(model ? *model : *model_, *backend_, tok_.get(), cfg);
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

// `tolerance`: how far logprobs may differ (0: bit for bit).
void expect_same(const std::vector<Collected>& want, const std::vector<Collected>& got,
                 float tolerance = 0) {
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
        EXPECT_NEAR(g[k].logprob, lps[k].logprob, tolerance) << "seq " << seq << " token " << k;
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

// Under a grammar: each row of a draft gets the mask that follows the guesses before it, so the
// tokens are the plain engine's and valid; a grammar that repeats itself is guessed right.
TEST_F(EngineSpecTest, GrammarBoundDraftsKeepOutputsAndFollowTheGrammar) {
  auto compiler = GrammarCompiler::create(*tok_, 256, {2});
  ASSERT_TRUE(compiler.ok()) << compiler.status().to_string();
  GrammarSpec spec{GrammarKind::kJsonSchema, R"({"type": "array", "minItems": 3, "maxItems": 3,
      "items": {"enum": ["hello world", "abc"]}})"};
  spec.any_whitespace = false;
  auto g = (*compiler)->compile(spec);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::mt19937 rng(31);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r;
    r.prompt = random_prompt(rng, 4 + i);
    r.params.max_tokens = 48;
    r.params.temperature = i % 2 ? 1.0f : 0.0f;
    r.params.seed = 7 + i;
    r.params.logprobs = 1;
    r.detokenize = false;
    if (i != 5) r.grammar = *g;  // one free request beside them
    reqs.push_back(std::move(r));
  }
  EngineStats st;
  const auto plain = run(reqs, false);
  const auto spec_out = run(reqs, true, &st);
  expect_same(plain, spec_out);
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> ids = spec_out[i].tokens.at(0);
    if (!ids.empty() && ids.back() == 2) ids.pop_back();
    auto text = tok_->decode(ids, false);
    ASSERT_TRUE(text.ok());
    const auto j = nlohmann::json::parse(*text, nullptr, false);
    ASSERT_TRUE(j.is_array()) << *text;
    EXPECT_EQ(j.size(), 3u) << *text;
  }
  EXPECT_GT(st.spec_accepted_tokens, 10) << "the repeated items were not guessed";
}

// A draft model: the target itself (its guesses are the target's own), and an unrelated model of
// the same vocabulary (its guesses almost all wrong). Greedy requests: outputs unchanged, and the
// target as its own draft has every guess right (the same logits, bit for bit, on this backend).
TEST_F(EngineSpecTest, DraftModelGreedyOutputsAreUnchanged) {
  auto other_ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/qwen2");
  ASSERT_TRUE(other_ckpt.ok()) << other_ckpt.status().to_string();
  auto other = load_model(*other_ckpt, *backend_);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  std::mt19937 rng(21);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy_request(random_prompt(rng, 5 + 2 * i), 30, 2);
    r.detokenize = false;
    reqs.push_back(std::move(r));
  }
  const auto plain = run(reqs, false);
  EngineStats self_stats, other_stats;
  expect_same(plain, run_with(reqs, draft(*model_, 3), &self_stats));
  expect_same(plain, run_with(reqs, draft(**other, 3), &other_stats));
  EXPECT_GT(self_stats.spec_draft_tokens, 0);
  EXPECT_EQ(self_stats.spec_accepted_tokens, self_stats.spec_draft_tokens);
  EXPECT_EQ(self_stats.spec_accepted_per_position.size(), 3u);
  EXPECT_GT(other_stats.spec_drafts, 0);
  EXPECT_LT(other_stats.spec_accepted_tokens, other_stats.spec_draft_tokens / 2);
}

// Sampled requests draw their guesses from the draft's distribution after their own processors
// (temperature, top-k/top-p/min-p, penalties, logit bias, min_tokens, n > 1). With the target as
// its own draft, q equals p bit for bit, so the rejection sampler keeps every guess: any processor
// applied differently to the draft's row or the target's would show as a rejection.
TEST_F(EngineSpecTest, DrawnGuessesOfTheTargetItselfAreAllKept) {
  std::mt19937 rng(22);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy_request(random_prompt(rng, 6 + i), 24, 2);
    r.detokenize = false;
    SamplingParams& p = r.params;
    p.seed = 100 + i;
    p.temperature = 0.9f;
    if (i == 1) p.top_k = 8, p.top_p = 0.9f;
    if (i == 2) p.min_p = 0.05f;
    if (i == 3) p.repetition_penalty = 1.3f, p.frequency_penalty = 0.4f, p.presence_penalty = 0.2f;
    if (i == 4) p.logit_bias = {{7, 2.0f}, {40, 3.0f}}, p.min_tokens = 10, p.stop_token_ids = {7};
    if (i == 5) p.n = 2;
    reqs.push_back(std::move(r));
  }
  EngineStats st;
  const auto out = run_with(reqs, draft(*model_, 3), &st);
  EXPECT_GT(st.spec_draft_tokens, 20);
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  for (size_t i = 0; i < out.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_TRUE(out[i].done.error.ok());
    for (const auto& [seq, toks] : out[i].tokens) {
      EXPECT_EQ(toks.size(), 24u);  // ignore_eos
      EXPECT_EQ(out[i].logprobs.at(seq).size(), toks.size());
    }
  }
}

// The tokens of drafts drawn from an unrelated model still follow the target's distribution: the
// second token of 3,000 requests of one prompt (different seeds; the first verified position) has
// the same distribution with speculation as without (a two-sample chi-square test), where keeping
// the draft's guesses would give the draft's. The outputs themselves differ (other draws).
TEST_F(EngineSpecTest, DrawnGuessesOfAnotherModelKeepTheTargetsDistribution) {
  auto other_ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/qwen2");
  ASSERT_TRUE(other_ckpt.ok()) << other_ckpt.status().to_string();
  auto other = load_model(*other_ckpt, *backend_);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  std::mt19937 rng(23);
  const std::vector<int32_t> prompt = random_prompt(rng, 8);
  constexpr int kRequests = 3000;
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r = greedy_request(prompt, 3);
    r.detokenize = false;
    r.params.temperature = 1.0f;  // p and q overlap over the whole vocabulary
    r.params.top_k = 40;
    r.params.seed = 1000 + i;
    reqs.push_back(std::move(r));
  }
  auto histogram = [](const std::vector<Collected>& runs) {
    std::map<int32_t, int64_t> h;
    for (const Collected& c : runs) ++h[c.tokens.at(0).at(1)];
    return h;
  };
  EngineStats st;
  const auto plain = histogram(run(reqs, false, nullptr, 64 << 20, 512));
  const auto spec = histogram(run_with(reqs, draft(**other, 2), &st, 64 << 20, 512));
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  // Two-sample chi-square over the tokens either run drew (equal sample sizes).
  std::map<int32_t, std::pair<int64_t, int64_t>> cells;
  for (const auto& [t, n] : plain) cells[t].first = n;
  for (const auto& [t, n] : spec) cells[t].second = n;
  double x2 = 0;
  for (const auto& [t, c] : cells) {
    const double a = static_cast<double>(c.first), b = static_cast<double>(c.second);
    x2 += (a - b) * (a - b) / (a + b);
  }
  const int dof = static_cast<int>(cells.size()) - 1;
  ASSERT_GT(dof, 2);
  const double z = 3.719, k = 2.0 / (9.0 * dof);  // p = 1e-4 (Wilson-Hilferty)
  EXPECT_LT(x2, dof * std::pow(1.0 - k + z * std::sqrt(k), 3.0)) << dof << " degrees of freedom";
}

// DeepSeek-V3's MTP module (the tiny golden model with a random MTP layer,
// tests/data/mtp/deepseek_v3; its guesses against the reference: tests/model/
// deepseek_mtp_test.cpp): greedy outputs unchanged with prompts prefilled over several steps, a
// prefix from the prefix cache (the module restarts after it), a KV cache small enough to
// preempt, and sampled requests, whose guesses are drawn from the module's distribution.
TEST_F(EngineSpecTest, MtpOutputsAreUnchanged) {
  auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/mtp/deepseek_v3");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto target = load_model(*ckpt, *backend_);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  auto mtp = load_mtp_module(*ckpt, *backend_, **target);
  ASSERT_TRUE(mtp.ok()) << mtp.status().to_string();
  SpeculativeConfig sc;
  sc.method = SpeculativeConfig::Method::kMtp;
  sc.mtp = mtp->get();
  sc.num_tokens = 3;
  sc.disable_by_batch_size = 0;
  std::mt19937 rng(31);
  const std::vector<int32_t> shared = random_prompt(rng, 12);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = random_prompt(rng, 4 + 2 * i);  // within 64 positions
    if (i % 3 == 1) prompt.insert(prompt.begin(), shared.begin(), shared.end());
    EngineRequest r = greedy_request(prompt, 24, 2);
    r.detokenize = false;
    reqs.push_back(std::move(r));
  }
  // MLA computes a fresh prompt in one of two forms of the same sum depending on how the step
  // batches it (model/deepseek_v2.cpp): logprobs may differ in their last bits between runs.
  const float tolerance = 1e-5f;
  EngineStats st;
  expect_same(run_with(reqs, {}, nullptr, 4 << 20, 32, target->get()),
              run_with(reqs, sc, &st, 4 << 20, 32, target->get()), tolerance);
  EXPECT_GT(st.spec_drafts, 0);
  // Preempted mid-way: a cache for about two sequences.
  EngineStats small;
  expect_same(run_with(reqs, {}, nullptr, 40 << 10, 32, target->get()),
              run_with(reqs, sc, &small, 40 << 10, 32, target->get()), tolerance);
  EXPECT_GT(small.spec_drafts, 0);
  EXPECT_GT(small.scheduler.n_preemptions, 0) << "the cache did not preempt: shows nothing";
  // Sampled: drawn guesses verified by the rejection sampler, so the tokens differ from the
  // plain run's draws but every request completes its tokens.
  std::vector<EngineRequest> sampled = reqs;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].params.temperature = 0.9f;
    sampled[i].params.top_k = 40;
    sampled[i].params.seed = 100 + i;
  }
  EngineStats drawn;
  const auto out = run_with(sampled, sc, &drawn, 4 << 20, 32, target->get());
  for (const Collected& c : out) EXPECT_EQ(c.done.completion_tokens, 24);
  EXPECT_GT(drawn.spec_draft_tokens, 0);
}

TEST_F(EngineSpecTest, ADraftModelOfAnotherVocabularyIsRefused) {
  const std::string dir = testing::TempDir() + "/draft_vocab_300";
  std::filesystem::create_directories(dir);
  std::ifstream in(test_source_dir() + "/tests/data/golden/llama/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["vocab_size"] = 300;
  std::ofstream(dir + "/config.json") << config.dump();
  auto ckpt = open_dummy_checkpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto draft_model = load_model(*ckpt, *backend_);
  ASSERT_TRUE(draft_model.ok()) << draft_model.status().to_string();
  EngineConfig cfg;
  cfg.kv_cache_memory = 4 << 20;
  cfg.speculative = draft(**draft_model, 4);
  auto e = Engine::create(*model_, *backend_, nullptr, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("vocabulary (300 tokens)"), std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace pagellm
