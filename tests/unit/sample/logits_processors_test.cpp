#include "sample/logits_processors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "sample/sample_math.h"
#include "sample/sample_rng.h"

namespace pagellm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ExpNonpositive, WithinThreeUlpOfLibmAndZeroExactlyBelowTheCut) {
  int checked = 0;
  float worst = 0.0f;
  for (float s = 0.0f; s >= kExpMinArg; s = s * 1.0001f - 1e-4f) {
    const float got = exp_nonpositive(s);
    const double want = std::exp(static_cast<double>(s));
    const double ulp = std::nextafter(static_cast<float>(want), kInf) - static_cast<float>(want);
    worst = std::max(worst, static_cast<float>(std::fabs(got - want) / ulp));
    ++checked;
  }
  EXPECT_LE(worst, 3.0f);
  EXPECT_GT(checked, 10000);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_GT(exp_nonpositive(kExpMinArg), 0.0f);
  EXPECT_EQ(exp_nonpositive(std::nextafter(kExpMinArg, -kInf)), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1000.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
  // Monotonic over a dense sweep (the cuts rely on s, but sums should not wobble either).
  float prev = 2.0f;
  for (float s = 0.0f; s > -10.0f; s -= 1.0f / 4096) {
    const float e = exp_nonpositive(s);
    ASSERT_LE(e, prev) << s;
    prev = e;
  }
}

TEST(LogitBias, AddsBiasAndRejectsBadTokens) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, -kInf};
  const std::vector<LogitBias> bias = {{0, 100.0f}, {2, -100.0f}, {3, 5.0f}};
  ASSERT_TRUE(apply_logit_bias(x, bias).ok());
  EXPECT_EQ(x, (std::vector<float>{101.0f, 2.0f, -97.0f, -kInf}));
  const std::vector<LogitBias> bad = {{4, 1.0f}};
  Status st = apply_logit_bias(x, bad);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("token 4"), std::string::npos) << st.message();
}

TEST(SuppressTokens, MasksListedTokens) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> ids = {2, 0};
  ASSERT_TRUE(suppress_tokens(x, ids).ok());
  EXPECT_EQ(x, (std::vector<float>{-kInf, 2.0f, -kInf}));
  const std::vector<int32_t> bad = {-1};
  EXPECT_FALSE(suppress_tokens(x, bad).ok());
}

TEST(Penalties, MatchHandComputation) {
  // prompt {1, 2}, output {2, 3, 3}; repetition 2, presence 0.5, frequency 0.25.
  std::vector<float> x = {1.0f, 2.0f, -1.0f, 3.0f, 0.5f, -2.0f};
  const std::vector<int32_t> prompt = {1, 2}, output = {2, 3, 3};
  ASSERT_TRUE(apply_penalties(x, prompt, output, 2.0f, 0.5f, 0.25f).ok());
  EXPECT_FLOAT_EQ(x[0], 1.0f);          // untouched
  EXPECT_FLOAT_EQ(x[1], 1.0f);          // prompt only: 2 / 2, no presence/frequency
  EXPECT_FLOAT_EQ(x[2], -2.75f);        // -1 * 2 - (1 * 0.25 + 0.5)
  EXPECT_FLOAT_EQ(x[3], 0.5f);          // 3 / 2 - (2 * 0.25 + 0.5)
  EXPECT_FLOAT_EQ(x[4], 0.5f);
  EXPECT_FLOAT_EQ(x[5], -2.0f);
}

TEST(Penalties, EachPenaltyAloneAndScratchReuse) {
  SampleScratch scratch;
  const std::vector<int32_t> prompt = {0, 0, 4}, output = {1, 1, 1, 4};
  for (int round = 0; round < 3; ++round) {  // reuse of the stamped scratch must not leak counts
    std::vector<float> x = {4.0f, -4.0f, 0.0f, 1.0f, 2.0f};
    ASSERT_TRUE(apply_penalties(x, prompt, output, 1.0f, 0.0f, 1.5f, &scratch).ok());
    EXPECT_EQ(x, (std::vector<float>{4.0f, -8.5f, 0.0f, 1.0f, 0.5f}));  // frequency only
    x = {4.0f, -4.0f, 0.0f, 1.0f, 2.0f};
    ASSERT_TRUE(apply_penalties(x, prompt, output, 1.0f, -1.0f, 0.0f, &scratch).ok());
    EXPECT_EQ(x, (std::vector<float>{4.0f, -3.0f, 0.0f, 1.0f, 3.0f}));  // negative presence
    x = {4.0f, -4.0f, 0.0f, 1.0f, 2.0f};
    ASSERT_TRUE(apply_penalties(x, prompt, output, 4.0f, 0.0f, 0.0f, &scratch).ok());
    EXPECT_EQ(x, (std::vector<float>{1.0f, -16.0f, 0.0f, 1.0f, 0.5f}));  // repetition once each
  }
  std::vector<float> x = {1.0f, 1.0f};
  const std::vector<int32_t> bad = {2};
  Status st = apply_penalties(x, {}, bad, 1.0f, 0.5f, 0.0f, &scratch);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("output token 2"), std::string::npos) << st.message();
  st = apply_penalties(x, bad, {}, 1.1f, 0.0f, 0.0f, &scratch);
  EXPECT_NE(st.message().find("prompt token 2"), std::string::npos) << st.message();
}

TEST(Penalties, TinyRepetitionPenaltyStaysFinite) {
  std::vector<float> x = {1e30f, -1e30f, -kInf};
  const std::vector<int32_t> output = {0, 1, 2};
  ASSERT_TRUE(apply_penalties(x, {}, output, 1e-20f, 0.0f, 0.0f).ok());
  EXPECT_EQ(x[0], std::numeric_limits<float>::max());
  EXPECT_FLOAT_EQ(x[1], -1e10f);
  EXPECT_EQ(x[2], -kInf);
}

TEST(Argmax, LowestIdWinsTies) {
  EXPECT_EQ(argmax_token(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}), 1);
  EXPECT_EQ(argmax_token(std::vector<float>{-kInf, -kInf, -5.0f}), 2);
  EXPECT_EQ(argmax_token(std::vector<float>{-kInf, -kInf}), -1);
  EXPECT_EQ(argmax_token(std::vector<float>{7.0f, 7.0f, 7.0f}), 0);
}

// Brute-force top-k: full sort in the token order.
std::vector<TokenLogit> sorted_all(const std::vector<float>& x) {
  std::vector<TokenLogit> all;
  for (size_t i = 0; i < x.size(); ++i) all.push_back({x[i], static_cast<int32_t>(i)});
  std::sort(all.begin(), all.end(), [](const TokenLogit& a, const TokenLogit& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.token < b.token;
  });
  return all;
}

TEST(SelectTopK, MatchesFullSortIncludingTiesAndMasks) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int vocab : {1, 7, 19, 111, 1000, 5003}) {
    for (int k : {1, 2, 5, 64, 100, 4999, 6000}) {
      // Values from a small set so ties are frequent, plus some -inf.
      std::uniform_int_distribution<int> level(0, 40);
      std::vector<float> x(vocab);
      for (float& v : x) {
        const int l = level(rng);
        v = l == 0 ? -kInf : static_cast<float>(l) * 0.25f;
      }
      std::vector<TokenLogit> got;
      select_top_k(x, k, got);
      const std::vector<TokenLogit> want = sorted_all(x);
      ASSERT_EQ(got.size(), std::min<size_t>(k, vocab));
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(got[j].token, want[j].token) << "vocab " << vocab << " k " << k << " j " << j;
        ASSERT_EQ(got[j].logit, want[j].logit);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 42);
}

// Reference for truncated_distribution, straight from the definition in the header.
std::vector<TokenProb> reference_distribution(const std::vector<float>& x,
                                              const TruncationParams& p) {
  const std::vector<TokenLogit> order = sorted_all(x);
  const float m = order[0].logit;
  size_t n_finite = 0;
  for (float v : x) n_finite += v > -kInf;
  size_t len = (p.top_k > 0 && static_cast<size_t>(p.top_k) < n_finite) ? p.top_k : n_finite;
  std::vector<float> sc(len), w(len);
  for (size_t j = 0; j < len; ++j) {
    sc[j] = (order[j].logit - m) / p.temperature;
    w[j] = exp_nonpositive(sc[j]);
  }
  if (p.top_p < 1.0f) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    double cum = 0.0;
    for (size_t j = 0; j < len; ++j) {
      cum += w[j];
      if (cum >= p.top_p * total) {
        len = j + 1;
        break;
      }
    }
  }
  std::vector<TokenProb> dist;
  const float s_min = p.min_p > 0.0f ? std::log(p.min_p) : -kInf;
  for (size_t j = 0; j < len; ++j)
    if (w[j] > 0.0f && sc[j] >= s_min) dist.push_back({order[j].token, w[j]});
  double total = 0.0;
  for (const TokenProb& tp : dist) total += tp.prob;
  for (TokenProb& tp : dist) tp.prob /= total;
  std::sort(dist.begin(), dist.end(),
            [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
  return dist;
}

void expect_same_distribution(const std::vector<TokenProb>& got,
                              const std::vector<TokenProb>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j].token, want[j].token) << what << " j " << j;
    // Both normalize the same fp32 weights; only the double summation order differs.
    ASSERT_NEAR(got[j].prob, want[j].prob, 1e-12) << what << " token " << got[j].token;
  }
}

TEST(TruncatedDistribution, MatchesDefinitionOnHandMadeLogits) {
  // probs at T=1 for logits ln(4), ln(3), ln(2), ln(1): 0.4, 0.3, 0.2, 0.1.
  const std::vector<float> x = {std::log(2.0f), std::log(4.0f), std::log(1.0f), std::log(3.0f)};
  auto tokens = [&](const TruncationParams& p) {
    std::vector<int32_t> out;
    for (const TokenProb& tp : truncated_distribution(x, p)) out.push_back(tp.token);
    return out;
  };
  EXPECT_EQ(tokens({1.0f, -1, 1.0f, 0.0f}), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(tokens({1.0f, 2, 1.0f, 0.0f}), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(tokens({1.0f, 0, 0.69f, 0.0f}), (std::vector<int32_t>{1, 3}));    // 0.4+0.3 >= 0.69
  EXPECT_EQ(tokens({1.0f, 0, 0.71f, 0.0f}), (std::vector<int32_t>{0, 1, 3}));  // needs 0.2 more
  EXPECT_EQ(tokens({1.0f, 3, 0.75f, 0.0f}), (std::vector<int32_t>{1, 3}));  // 0.7/0.9 >= 0.75
  EXPECT_EQ(tokens({1.0f, -1, 1.0f, 0.45f}), (std::vector<int32_t>{0, 1, 3}));  // p >= 0.18
  EXPECT_EQ(tokens({1.0f, -1, 1.0f, 0.51f}), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(tokens({1.0f, 1, 1.0f, 0.0f}), (std::vector<int32_t>{1}));
  const std::vector<TokenProb> d = truncated_distribution(x, {1.0f, 3, 1.0f, 0.0f});
  ASSERT_EQ(d.size(), 3u);
  EXPECT_NEAR(d[0].prob, 0.2 / 0.9, 1e-6);
  EXPECT_NEAR(d[1].prob, 0.4 / 0.9, 1e-6);
  EXPECT_NEAR(d[2].prob, 0.3 / 0.9, 1e-6);
  // Temperature 0.5 squares the odds: 16:9:4:1.
  const std::vector<TokenProb> t = truncated_distribution(x, {0.5f, -1, 1.0f, 0.0f});
  ASSERT_EQ(t.size(), 4u);
  EXPECT_NEAR(t[1].prob, 16.0 / 30.0, 1e-6);
  EXPECT_NEAR(t[2].prob, 1.0 / 30.0, 1e-6);
}

TEST(TruncatedDistribution, MatchesDefinitionOnRandomLogits) {
  std::mt19937 rng(20240611);
  int checked = 0;
  const TruncationParams params[] = {
      {1.0f, -1, 1.0f, 0.0f},  {0.7f, 40, 1.0f, 0.0f},   {1.3f, -1, 0.9f, 0.0f},
      {0.8f, 50, 0.8f, 0.0f},  {1.0f, -1, 1.0f, 0.05f},  {2.0f, 10, 0.95f, 0.1f},
      {0.2f, -1, 0.5f, 0.01f}, {5.0f, -1, 0.999f, 0.0f}, {1.0f, 1, 0.3f, 0.0f},
      {1.0f, 3000, 0.99f, 0.0f}};
  for (int vocab : {1, 7, 19, 111, 4099, 32000}) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x(vocab);
    for (float& v : x) v = normal(rng);
    if (vocab > 10) x[3] = x[9] = -kInf;  // masked tokens are never kept
    if (vocab > 20) x[17] = x[5];         // a tie
    SampleScratch scratch;
    for (const TruncationParams& p : params) {
      const std::string what = "vocab " + std::to_string(vocab) + " T " +
                               std::to_string(p.temperature) + " k " + std::to_string(p.top_k) +
                               " p " + std::to_string(p.top_p) + " min_p " +
                               std::to_string(p.min_p);
      expect_same_distribution(truncated_distribution(x, p, &scratch),
                               reference_distribution(x, p), what);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 60);
}

TEST(TruncatedDistribution, FlatDistributionsAndMasks) {
  // Many equal logits: top-k keeps exactly k (the lowest ids), top-p the lowest-id prefix.
  std::vector<float> x(1000, 0.5f);
  x[500] = -kInf;
  std::vector<TokenProb> d = truncated_distribution(x, {1.0f, 10, 1.0f, 0.0f});
  ASSERT_EQ(d.size(), 10u);
  EXPECT_EQ(d.back().token, 9);
  d = truncated_distribution(x, {1.0f, -1, 0.25f, 0.0f});
  expect_same_distribution(d, reference_distribution(x, {1.0f, -1, 0.25f, 0.0f}), "flat top-p");
  EXPECT_EQ(d.size(), 250u);  // 250 of 999 tokens carry 0.2503 >= 0.25; 249 do not
  // All masked: nothing to sample.
  std::vector<float> masked(5, -kInf);
  EXPECT_TRUE(truncated_distribution(masked, {}).empty());
  EXPECT_EQ(sample_truncated(masked, {}, 0.5), -1);
  // Extreme spread: tokens whose weight underflows are dropped, never sampled.
  std::vector<float> spread = {0.0f, -200.0f, -50.0f};
  d = truncated_distribution(spread, {1.0f, -1, 1.0f, 0.0f});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].token, 0);
  EXPECT_EQ(d[1].token, 2);
}

TEST(SampleTruncated, IsTheInverseCdfInTokenIdOrder) {
  const std::vector<float> x = {std::log(2.0f), std::log(4.0f), std::log(1.0f), std::log(3.0f)};
  // Kept {0,1,3} with probs 2/9, 4/9, 3/9 in id order: CDF 0.222, 0.667, 1.
  const TruncationParams p{1.0f, 3, 1.0f, 0.0f};
  EXPECT_EQ(sample_truncated(x, p, 0.0), 0);
  EXPECT_EQ(sample_truncated(x, p, 0.2), 0);
  EXPECT_EQ(sample_truncated(x, p, 0.23), 1);
  EXPECT_EQ(sample_truncated(x, p, 0.66), 1);
  EXPECT_EQ(sample_truncated(x, p, 0.67), 3);
  EXPECT_EQ(sample_truncated(x, p, std::nextafter(1.0, 0.0)), 3);
  // The same through the implicit (no top-k/top-p) and the bucketed top-p paths.
  const TruncationParams all{1.0f, -1, 1.0f, 0.0f};  // CDF 0.2, 0.6, 0.7, 1
  EXPECT_EQ(sample_truncated(x, all, 0.19), 0);
  EXPECT_EQ(sample_truncated(x, all, 0.21), 1);
  EXPECT_EQ(sample_truncated(x, all, 0.65), 2);
  EXPECT_EQ(sample_truncated(x, all, 0.71), 3);
  const TruncationParams nucleus{1.0f, -1, 0.75f, 0.0f};  // {1, 3, 0}: 0.4+0.3 < 0.75
  EXPECT_EQ(sample_truncated(x, nucleus, 0.1), 0);
  EXPECT_EQ(sample_truncated(x, nucleus, 0.5), 1);
  EXPECT_EQ(sample_truncated(x, nucleus, 0.9), 3);
}

// Chi-square critical value for a one-sided tail probability of 1e-6 (z = 4.753), by the
// Wilson-Hilferty approximation (accurate to a few percent for df >= 1, ample for a bound).
double chi_square_critical_1e6(int df) {
  const double z = 4.753, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Draws kDraws tokens with u = uniform01(seed, i) and checks the empirical frequencies against
// the reference distribution with a chi-square test (false-failure probability 1e-6 for a fresh
// seed; the seeds are fixed, so the outcome is deterministic), and that no token outside the kept
// set is ever drawn.
void check_frequencies(const std::vector<float>& x, const TruncationParams& p, uint64_t seed) {
  constexpr int kDraws = 20000;
  const std::vector<TokenProb> want = reference_distribution(x, p);
  std::map<int32_t, int> counts;
  SampleScratch scratch;
  for (int i = 0; i < kDraws; ++i) ++counts[sample_truncated(x, p, uniform01(seed, i), &scratch)];
  std::map<int32_t, double> prob;
  for (const TokenProb& tp : want) prob[tp.token] = tp.prob;
  for (const auto& [token, c] : counts)
    ASSERT_TRUE(prob.count(token)) << "token " << token << " drawn " << c
                                   << " times but lies outside the kept set";
  // Pool categories with expected count < 5 into one bin, as the chi-square test requires.
  double chi2 = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
  int bins = 0;
  for (const TokenProb& tp : want) {
    const double expected = tp.prob * kDraws;
    const double observed = counts.count(tp.token) ? counts[tp.token] : 0;
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_observed += observed;
      continue;
    }
    chi2 += (observed - expected) * (observed - expected) / expected;
    ++bins;
  }
  if (pooled_expected > 0.0) {
    chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) /
            std::max(pooled_expected, 1e-9);
    ++bins;
  }
  if (bins < 2) return;  // a single outcome: the support check above is the whole test
  EXPECT_LT(chi2, chi_square_critical_1e6(bins - 1))
      << "T " << p.temperature << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p
      << " bins " << bins;
}

TEST(SampleTruncated, EmpiricalFrequenciesMatchTheTruncatedDistribution) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(257);
  for (float& v : x) v = normal(rng);
  x[0] = x[1];  // a tie straddling cut-offs
  const TruncationParams params[] = {
      {1.0f, -1, 1.0f, 0.0f},   // temperature only
      {0.6f, -1, 1.0f, 0.0f},   // sharper
      {2.5f, -1, 1.0f, 0.0f},   // flatter
      {1.0f, 8, 1.0f, 0.0f},    // top-k
      {0.8f, -1, 0.7f, 0.0f},   // top-p
      {1.2f, 30, 0.9f, 0.0f},   // top-k then top-p
      {1.0f, -1, 1.0f, 0.1f},   // min-p
      {1.5f, 20, 0.95f, 0.05f}  // all of them
  };
  uint64_t seed = 1000;
  for (const TruncationParams& p : params) check_frequencies(x, p, ++seed);
}

}  // namespace
}  // namespace pagellm
