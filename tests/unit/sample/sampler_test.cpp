#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace pagellm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A batch of rows owning its logits, histories and params.
struct Batch {
  int32_t vocab;
  std::vector<float> logits;  // [n, vocab]
  std::vector<SampleRow> rows;
  std::vector<SampleOutput> out;

  Tensor tensor() { return Tensor(logits.data(), DType::kF32, {(int64_t)rows.size(), vocab}); }
};

SamplerConfig cfg(int32_t vocab, std::vector<int32_t> eos = {}) {
  SamplerConfig c;
  c.vocab_size = vocab;
  c.eos_token_ids = std::move(eos);
  return c;
}

Status run(const Sampler& sampler, Batch& b) {
  b.out.assign(b.rows.size(), SampleOutput{});
  return sampler.sample(b.tensor(), b.rows, b.out);
}

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler sampler(cfg(5));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.top_k = 2;  // ignored by greedy
  Batch b{5, {1, 3, 2, 3, 0, /*row 1*/ -kInf, -1, -1, -kInf, -2}, {}, {}};
  b.rows = {{&greedy, {}, {}, 1}, {&greedy, {}, {}, 2}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_EQ(b.out[0].token, 1);
  EXPECT_EQ(b.out[1].token, 1);
  EXPECT_TRUE(b.out[0].status.ok());
  EXPECT_TRUE(std::isnan(b.out[0].logprob));  // logprobs not requested
  EXPECT_EQ(b.out[0].rank, 0);
}

TEST(Sampler, LogitBiasPlusMinus100) {
  Sampler sampler(cfg(6));
  std::vector<float> base = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 0.0f};
  SamplingParams ban;  // -100 on the favourite: never drawn at T = 1
  ban.logit_bias = {{3, -100.0f}};
  SamplingParams force;  // +100 on an unlikely token: always drawn, also when greedy
  force.logit_bias = {{4, 100.0f}};
  SamplingParams force_greedy = force;
  force_greedy.temperature = 0.0f;
  std::map<int32_t, int> banned_counts;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Batch b{6, {}, {}, {}};
    for (int r = 0; r < 3; ++r) b.logits.insert(b.logits.end(), base.begin(), base.end());
    b.rows = {{&ban, {}, {}, seed}, {&force, {}, {}, seed}, {&force_greedy, {}, {}, seed}};
    ASSERT_TRUE(run(sampler, b).ok());
    ++banned_counts[b.out[0].token];
    ASSERT_EQ(b.out[1].token, 4);
    ASSERT_EQ(b.out[2].token, 4);
  }
  EXPECT_EQ(banned_counts.count(3), 0u);
  EXPECT_GT(banned_counts[0], 0);
  // The caller's logits are never modified.
  Batch b{6, base, {{&ban, {}, {}, 1}}, {}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_EQ(b.logits, base);
}

TEST(Sampler, GrammarMaskLeavesOnlyAllowedTokens) {
  // 40 tokens (two mask words); the grammar allows 3 and 37, the two least likely.
  constexpr int32_t V = 40;
  Sampler sampler(cfg(V));
  std::vector<float> base(V);
  for (int32_t t = 0; t < V; ++t) base[t] = t == 3 || t == 37 ? -2.0f : 1.0f + 0.01f * t;
  const std::vector<uint32_t> mask = {1u << 3, 1u << (37 - 32)};
  SamplingParams t1, greedy, lp;
  greedy.temperature = 0.0f;
  lp.logprobs = 1;
  std::map<int32_t, int> counts;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    Batch b{V, {}, {}, {}};
    for (int r = 0; r < 3; ++r) b.logits.insert(b.logits.end(), base.begin(), base.end());
    b.rows = {{&t1, {}, {}, seed, mask}, {&greedy, {}, {}, seed, mask}, {&lp, {}, {}, seed, mask}};
    ASSERT_TRUE(run(sampler, b).ok());
    ++counts[b.out[0].token];
    ASSERT_EQ(b.out[1].token, 3);  // the argmax of the allowed, lowest id on ties
    // Logprobs stay the model's own (raw) distribution.
    ASSERT_NEAR(b.out[2].logprob,
                -2.0f - std::log(2 * std::exp(-2.0) +
                                 [&] {
                                   double z = 0;
                                   for (int32_t t = 0; t < V; ++t)
                                     if (t != 3 && t != 37) z += std::exp(base[t]);
                                   return z;
                                 }()),
                1e-4);
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[3], 150);
  EXPECT_GT(counts[37], 150);
  // A mask too short for the row is that row's error.
  Batch b{V, base, {{&t1, {}, {}, 1, std::span<const uint32_t>(mask).first(1)}}, {}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_FALSE(b.out[0].status.ok());
}

TEST(Sampler, MinTokensSuppressesEosAndStopIdsUntilReached) {
  Sampler sampler(cfg(6, {5}));
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 3;
  p.stop_token_ids = {4};
  const std::vector<float> row = {0.0f, 1.0f, 0.0f, 0.0f, 9.0f, 10.0f};
  std::vector<int32_t> history;
  std::vector<int32_t> tokens;
  for (int step = 0; step < 5; ++step) {
    Batch b{6, row, {{&p, {}, history, 7}}, {}};
    ASSERT_TRUE(run(sampler, b).ok());
    tokens.push_back(b.out[0].token);
    history.push_back(b.out[0].token);
  }
  // Steps 0-2 (fewer than 3 generated): EOS 5 and stop id 4 masked -> 1. Then EOS wins.
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 1, 1, 5, 5}));
  // ignore_eos: EOS does not stop, so it is not suppressed either; stop ids still are.
  p.ignore_eos = true;
  Batch b{6, row, {{&p, {}, {}, 7}}, {}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_EQ(b.out[0].token, 5);
}

TEST(Sampler, PenaltiesUseTheHistory) {
  Sampler sampler(cfg(4));
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 1.0f;
  const std::vector<int32_t> output = {0, 0};
  // Token 0 leads by 1.5; two occurrences cost 2, so token 1 wins.
  Batch b{4, {2.5f, 1.0f, 0.0f, 0.0f}, {{&p, {}, output, 1}}, {}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_EQ(b.out[0].token, 1);
  // Repetition penalty applies to prompt tokens too: 2.5 / 3 < 1.
  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 3.0f;
  const std::vector<int32_t> prompt = {0};
  Batch c{4, {2.5f, 1.0f, 0.0f, 0.0f}, {{&r, prompt, {}, 1}}, {}};
  ASSERT_TRUE(run(sampler, c).ok());
  EXPECT_EQ(c.out[0].token, 1);
}

// Reference log_softmax in double.
std::vector<double> log_softmax_ref(const std::vector<float>& x) {
  double m = -INFINITY;
  for (float v : x) m = std::max<double>(m, v);
  double z = 0.0;
  for (float v : x) z += std::exp(static_cast<double>(v) - m);
  std::vector<double> out;
  for (float v : x) out.push_back(v - m - std::log(z));
  return out;
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithTopNAndRank) {
  Sampler sampler(cfg(8));
  const std::vector<float> row = {1.0f, 4.0f, 2.0f, 4.0f, -kInf, 0.5f, 2.0f, 3.0f};
  const std::vector<double> ref = log_softmax_ref(row);
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 5;
  p.logit_bias = {{0, 50.0f}};  // changes the choice, not the reported (raw) logprobs
  Batch b{8, row, {{&p, {}, {}, 3}}, {}};
  ASSERT_TRUE(run(sampler, b).ok());
  ASSERT_EQ(b.out[0].token, 0);
  EXPECT_NEAR(b.out[0].logprob, ref[0], 1e-5);
  EXPECT_EQ(b.out[0].rank, 6);  // behind 1, 3, 7, 2, 6
  ASSERT_EQ(b.out[0].top_logprobs.size(), 5u);
  const int32_t want_ids[] = {1, 3, 7, 2, 6};  // ties: lower id first
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(b.out[0].top_logprobs[j].token, want_ids[j]);
    EXPECT_NEAR(b.out[0].top_logprobs[j].logprob, ref[want_ids[j]], 1e-5);
  }
  // logprobs = 0: the sampled token only.
  p.logprobs = 0;
  p.logit_bias = {{3, 1.0f}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_EQ(b.out[0].token, 3);
  EXPECT_EQ(b.out[0].rank, 2);  // tied with token 1 in the raw row, which has the lower id
  EXPECT_NEAR(b.out[0].logprob, ref[3], 1e-5);
  EXPECT_TRUE(b.out[0].top_logprobs.empty());
}

TEST(Sampler, LogprobsOnALargeRandomRow) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int32_t vocab = 32003;
  std::vector<float> row(vocab);
  for (float& v : row) v = normal(rng);
  const std::vector<double> ref = log_softmax_ref(row);
  LogprobsResult lp;
  compute_logprobs(row, 777, 20, lp);
  EXPECT_NEAR(lp.logprob, ref[777], 1e-4);  // |logprob| ~ 10-20: a few fp32 ulps
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  EXPECT_EQ(lp.rank, std::find(order.begin(), order.end(), 777) - order.begin() + 1);
  ASSERT_EQ(lp.top.size(), 20u);
  for (int j = 0; j < 20; ++j) {
    EXPECT_EQ(lp.top[j].token, order[j]);
    EXPECT_NEAR(lp.top[j].logprob, ref[order[j]], 1e-5);
  }
}

TEST(Sampler, PromptLogprobs) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, /*row 1*/ 3.0f, 3.0f, -1.0f};
  Tensor t(const_cast<float*>(logits.data()), DType::kF32, {2, 3});
  const std::vector<int32_t> next = {2, 1};
  std::vector<LogprobsResult> out(2);
  ASSERT_TRUE(compute_prompt_logprobs(t, next, 2, out).ok());
  EXPECT_NEAR(out[0].logprob, log_softmax_ref({0, 1, 2})[2], 1e-6);
  EXPECT_EQ(out[0].rank, 1);
  EXPECT_EQ(out[1].rank, 2);
  EXPECT_EQ(out[1].top[0].token, 0);
  EXPECT_EQ(out[1].top[1].token, 1);
  const std::vector<int32_t> bad = {2, 3};
  Status st = compute_prompt_logprobs(t, bad, 2, out);
  EXPECT_NE(st.message().find("row 1 token 3"), std::string::npos) << st.message();
}

// A toy "model": logits for (sequence, history) are a pure function of both, so a sequence's
// trajectory can be replayed in any batch.
std::vector<float> toy_logits(int32_t vocab, uint64_t seq, const std::vector<int32_t>& history) {
  uint64_t h = mix64(seq);
  for (int32_t t : history) h = mix64(h ^ static_cast<uint64_t>(t));
  std::vector<float> row(vocab);
  for (int32_t i = 0; i < vocab; ++i) row[i] = static_cast<float>(uniform01(h, i) * 8.0 - 4.0);
  return row;
}

struct Seq {
  uint64_t id;
  SamplingParams params;
  uint64_t seed;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

// Runs `steps` decode steps for `seqs` together, in the given row order each step.
void decode(const Sampler& sampler, std::vector<Seq*> seqs, int steps, bool shuffle_each_step) {
  std::mt19937 order_rng(static_cast<uint32_t>(seqs.size() * 31 + steps));
  const int32_t vocab = sampler.config().vocab_size;
  for (int s = 0; s < steps; ++s) {
    if (shuffle_each_step) std::shuffle(seqs.begin(), seqs.end(), order_rng);
    Batch b{vocab, {}, {}, {}};
    for (Seq* q : seqs) {
      const std::vector<float> row = toy_logits(vocab, q->id, q->output);
      b.logits.insert(b.logits.end(), row.begin(), row.end());
      b.rows.push_back({&q->params, q->prompt, q->output, q->seed});
    }
    ASSERT_TRUE(run(sampler, b).ok());
    for (size_t r = 0; r < seqs.size(); ++r) {
      ASSERT_TRUE(b.out[r].status.ok()) << b.out[r].status.to_string();
      seqs[r]->output.push_back(b.out[r].token);
    }
  }
}

std::vector<Seq> make_seqs(int n) {
  std::vector<Seq> seqs;
  for (int i = 0; i < n; ++i) {
    Seq q;
    q.id = 100 + i;
    q.seed = derive_sequence_seed(4242, i);
    q.prompt = {i % 7, 3, 9};
    q.params.temperature = 0.5f + 0.25f * (i % 4);
    q.params.top_k = (i % 3 == 0) ? -1 : 5 + i;
    q.params.top_p = (i % 2 == 0) ? 1.0f : 0.9f;
    q.params.min_p = (i % 5 == 0) ? 0.05f : 0.0f;
    q.params.repetition_penalty = (i % 4 == 1) ? 1.2f : 1.0f;
    q.params.frequency_penalty = (i % 4 == 2) ? 0.3f : 0.0f;
    q.params.logprobs = 2;
    seqs.push_back(q);
  }
  return seqs;
}

TEST(Sampler, SeededOutputDoesNotDependOnBatchCompositionOrOrder) {
  Sampler sampler(cfg(503));
  constexpr int kSeqs = 8, kSteps = 24;
  // Reference: each sequence alone.
  std::vector<Seq> alone = make_seqs(kSeqs);
  for (Seq& q : alone) decode(sampler, {&q}, kSteps, false);
  // All together, reshuffled every step.
  std::vector<Seq> together = make_seqs(kSeqs);
  std::vector<Seq*> all;
  for (Seq& q : together) all.push_back(&q);
  decode(sampler, all, kSteps, true);
  // Mixed with unrelated sequences, in reverse order.
  std::vector<Seq> mixed = make_seqs(kSeqs);
  std::vector<Seq> others = make_seqs(5);
  for (Seq& q : others) {
    q.id += 1000;
    q.seed = 77 + q.id;
  }
  std::vector<Seq*> crowd;
  for (int i = kSeqs - 1; i >= 0; --i) {
    crowd.push_back(&mixed[i]);
    if (i < 5) crowd.push_back(&others[i]);
  }
  decode(sampler, crowd, kSteps, false);
  int distinct_trajectories = 0;
  for (int i = 0; i < kSeqs; ++i) {
    EXPECT_EQ(together[i].output, alone[i].output) << "sequence " << i;
    EXPECT_EQ(mixed[i].output, alone[i].output) << "sequence " << i;
    distinct_trajectories += i > 0 && alone[i].output != alone[i - 1].output;
  }
  EXPECT_GT(distinct_trajectories, 0);
  // A different seed changes the trajectory (24 draws over ~10+ tokens: collision odds ~0).
  std::vector<Seq> reseeded = make_seqs(kSeqs);
  for (Seq& q : reseeded) q.seed ^= 0x1234;
  int differing = 0;
  for (int i = 0; i < kSeqs; ++i) {
    decode(sampler, {&reseeded[i]}, kSteps, false);
    differing += reseeded[i].output != alone[i].output;
  }
  EXPECT_GE(differing, kSeqs - 1);
}

TEST(Sampler, ParallelAndSerialAgree) {
  ThreadPool pool(4);
  SamplerConfig pc = cfg(1001), sc = cfg(1001);
  pc.pool = &pool;
  pc.min_rows_for_parallel = 2;
  sc.min_rows_for_parallel = 1 << 30;
  Sampler parallel(pc), serial(sc);
  std::vector<Seq> a = make_seqs(37), b = make_seqs(37);
  std::vector<Seq*> pa, pb;
  for (Seq& q : a) pa.push_back(&q);
  for (Seq& q : b) pb.push_back(&q);
  decode(parallel, pa, 6, false);
  decode(serial, pb, 6, false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].output, b[i].output) << i;
}

TEST(Sampler, StatisticsThroughTheBatchApiWithPerRowSeeds) {
  // One row per seed: the draw for seed s at step 0 is uniform01(s, 0); over many seeds the
  // frequencies follow the top-k distribution. Probabilities 0.4, 0.3, 0.2, 0.1 at T = 1,
  // top_k = 3 -> 4/9, 3/9, 2/9 for tokens 1, 3, 0.
  Sampler sampler(cfg(4));
  SamplingParams p;
  p.top_k = 3;
  const std::vector<float> row = {std::log(2.0f), std::log(4.0f), std::log(1.0f), std::log(3.0f)};
  constexpr int kRows = 20000;
  Batch b{4, {}, {}, {}};
  for (int i = 0; i < kRows; ++i) {
    b.logits.insert(b.logits.end(), row.begin(), row.end());
    b.rows.push_back({&p, {}, {}, static_cast<uint64_t>(i) * 7919});
  }
  ASSERT_TRUE(run(sampler, b).ok());
  int counts[4] = {};
  for (const SampleOutput& o : b.out) ++counts[o.token];
  EXPECT_EQ(counts[2], 0);  // outside the top-k set: exactly never
  const double probs[4] = {2.0 / 9, 4.0 / 9, 0.0, 3.0 / 9};
  // Binomial sd <= sqrt(n/4) = 71; 5.5 sd per count (false failure < 1e-7 for three counts).
  for (int t : {0, 1, 3}) EXPECT_NEAR(counts[t], probs[t] * kRows, 5.5 * 71) << t;
}

TEST(Sampler, RowErrorsAreIsolated) {
  Sampler sampler(cfg(3));
  SamplingParams p;
  SamplingParams pen;
  pen.presence_penalty = 1.0f;
  SamplingParams all_masked;
  all_masked.temperature = 0.0f;
  all_masked.min_tokens = 1;
  all_masked.stop_token_ids = {0};
  const std::vector<int32_t> bad_history = {3};
  Batch b{3,
          {0.0f, NAN, 1.0f, /*1*/ 1.0f, 2.0f, 3.0f, /*2*/ 1.0f, 2.0f, 3.0f, /*3*/ -kInf, -kInf,
           -kInf, /*4*/ 5.0f, -kInf, -kInf, /*5*/ 1.0f, kInf, 0.0f},
          {},
          {}};
  b.rows = {{&p, {}, {}, 1}, {&p, {}, {}, 1},          {&pen, {}, bad_history, 1},
            {&p, {}, {}, 1}, {&all_masked, {}, {}, 1}, {&p, {}, {}, 1}};
  ASSERT_TRUE(run(sampler, b).ok());
  EXPECT_NE(b.out[0].status.message().find("row 0: token 1 has a non-finite logit (nan)"),
            std::string::npos)
      << b.out[0].status.message();
  EXPECT_EQ(b.out[0].token, -1);
  EXPECT_TRUE(b.out[1].status.ok());
  EXPECT_GE(b.out[1].token, 0);
  EXPECT_NE(b.out[2].status.message().find("row 2: output token 3"), std::string::npos)
      << b.out[2].status.message();
  EXPECT_NE(b.out[3].status.message().find("every logit is -inf"), std::string::npos);
  EXPECT_NE(b.out[4].status.message().find("no token can be sampled"), std::string::npos)
      << b.out[4].status.message();
  EXPECT_NE(b.out[5].status.message().find("(+inf)"), std::string::npos);
}

TEST(Sampler, BatchLevelErrors) {
  Sampler sampler(cfg(4));
  SamplingParams p;
  std::vector<float> logits(8, 0.0f);
  std::vector<SampleRow> rows = {{&p, {}, {}, 1}, {&p, {}, {}, 1}};
  std::vector<SampleOutput> out(2);
  Tensor wrong_vocab(logits.data(), DType::kF32, {4, 2});
  Status st = sampler.sample(wrong_vocab, rows, out);
  EXPECT_NE(st.message().find("2 columns, the vocabulary has 4"), std::string::npos)
      << st.message();
  Tensor ok(logits.data(), DType::kF32, {2, 4});
  std::vector<SampleOutput> short_out(1);
  EXPECT_FALSE(sampler.sample(ok, rows, short_out).ok());
  Tensor f16(logits.data(), DType::kF16, {2, 4});
  EXPECT_FALSE(sampler.sample(f16, rows, out).ok());
  EXPECT_TRUE(sampler.sample(ok, rows, out).ok());
}

}  // namespace
}  // namespace pagellm
