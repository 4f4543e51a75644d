// The rejection sampler of speculative decoding: whatever distribution q a draft is drawn from,
// the tokens it yields follow the target's p. A chi-square test over the first two tokens of a
// two-guess draft (their joint must be p0 x p1) for several drafts: q = p, uniform, peaked where p
// is small, one-hot, disjoint from p, missing part of p's support. The same test rejects a sampler
// that keeps every guess and one that redraws from p instead of the residual (it can fail).
#include "sample/rejection_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace pagellm {
namespace {

using Dist = std::vector<TokenProb>;
constexpr int kVocab = 6;

Dist dense(std::vector<double> w) {
  double total = 0;
  for (double x : w) total += x;
  Dist d;
  for (int t = 0; t < static_cast<int>(w.size()); ++t)
    if (w[t] > 0) d.push_back({t, w[t] / total});
  return d;
}

// Upper critical value of chi-square with `dof` degrees of freedom at p = 1e-4
// (Wilson-Hilferty).
double chi_square_critical(int dof) {
  const double z = 3.719, a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// How a verifier turns a draft (g0 ~ q0, g1 ~ q1) into the first two tokens.
using Verifier = std::function<std::pair<int32_t, int32_t>(
    const Dist& p0, const Dist& p1, const Dist& q0, const Dist& q1, std::mt19937_64& rng)>;

std::pair<int32_t, int32_t> standard(const Dist& p0, const Dist& p1, const Dist& q0, const Dist& q1,
                                     std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int32_t g0 = draw_from(q0, u(rng));
  if (!keep_guess(p0, q0, g0, u(rng))) {
    const int32_t t0 = draw_residual(p0, q0, u(rng));
    return {t0, draw_from(p1, u(rng))};  // the draft ended: the next step samples plainly
  }
  const int32_t g1 = draw_from(q1, u(rng));
  if (!keep_guess(p1, q1, g1, u(rng))) return {g0, draw_residual(p1, q1, u(rng))};
  return {g0, g1};
}

struct ChiSquare {
  double statistic = 0;
  int dof = 0;
  int64_t impossible = 0;  // draws p0 x p1 gives no mass
  bool passes() const { return impossible == 0 && statistic < chi_square_critical(dof); }
};

// n draws of the verifier against p0 x p1.
ChiSquare chi_square(const Verifier& verify, const Dist& p0, const Dist& p1, const Dist& q0,
                     const Dist& q1, int n) {
  std::mt19937_64 rng(12345);
  std::vector<double> counts(kVocab * kVocab, 0.0);
  for (int i = 0; i < n; ++i) {
    const auto [a, b] = verify(p0, p1, q0, q1, rng);
    counts.at(a * kVocab + b) += 1;
  }
  ChiSquare r;
  int cells = 0;
  for (int a = 0; a < kVocab; ++a)
    for (int b = 0; b < kVocab; ++b) {
      const double e = n * probability_of(p0, a) * probability_of(p1, b);
      const double c = counts[a * kVocab + b];
      if (e == 0) {
        r.impossible += static_cast<int64_t>(c);
        continue;
      }
      r.statistic += (c - e) * (c - e) / e;
      ++cells;
    }
  r.dof = cells - 1;
  return r;
}

struct Case {
  std::string name;
  Dist q0, q1;
};

const Dist kP0 = dense({0.35, 0.25, 0.2, 0.1, 0.1, 0.0});
const Dist kP1 = dense({0.05, 0.0, 0.5, 0.05, 0.2, 0.2});

std::vector<Case> drafts() {
  return {
      {"q equal to p", kP0, kP1},
      {"uniform", dense({1, 1, 1, 1, 1, 1}), dense({1, 1, 1, 1, 1, 1})},
      {"peaked where p is small", dense({0.05, 0.05, 0.05, 0.8, 0.05, 0.0}),
       dense({0.9, 0.02, 0.02, 0.02, 0.02, 0.02})},
      {"one-hot", dense({0, 1, 0, 0, 0, 0}), dense({0, 0, 1, 0, 0, 0})},
      {"disjoint from p", dense({0, 0, 0, 0, 0, 1}), dense({0, 1, 0, 0, 0, 0})},
      {"part of p's support", dense({0.5, 0.5, 0, 0, 0, 0}), dense({0, 0, 0.3, 0.7, 0, 0})},
  };
}

TEST(RejectionSampler, TokensFollowTheTargetWhateverTheDraft) {
  constexpr int kDraws = 200000;
  for (const Case& c : drafts()) {
    SCOPED_TRACE(c.name);
    const ChiSquare r = chi_square(standard, kP0, kP1, c.q0, c.q1, kDraws);
    EXPECT_EQ(r.impossible, 0);
    EXPECT_LT(r.statistic, chi_square_critical(r.dof)) << "dof " << r.dof;
  }
}

// The test can fail: keeping every guess gives q's distribution, and redrawing from p after a
// rejection (instead of the residual) over-weights the tokens q favours.
TEST(RejectionSampler, TheChiSquareTestCatchesWrongVerifiers) {
  Verifier keep_all = [](const Dist&, const Dist&, const Dist& q0, const Dist& q1,
                         std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    return std::pair(draw_from(q0, u(rng)), draw_from(q1, u(rng)));
  };
  Verifier redraw_from_p = [](const Dist& p0, const Dist& p1, const Dist& q0, const Dist& q1,
                              std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const int32_t g0 = draw_from(q0, u(rng));
    if (!keep_guess(p0, q0, g0, u(rng)))
      return std::pair(draw_from(p0, u(rng)), draw_from(p1, u(rng)));
    const int32_t g1 = draw_from(q1, u(rng));
    if (!keep_guess(p1, q1, g1, u(rng))) return std::pair(g0, draw_from(p1, u(rng)));
    return std::pair(g0, g1);
  };
  for (const Case& c : drafts()) {
    SCOPED_TRACE(c.name);
    if (c.name == "q equal to p") continue;  // any of them is right there
    EXPECT_FALSE(chi_square(keep_all, kP0, kP1, c.q0, c.q1, 200000).passes());
    if (c.name == "disjoint from p") continue;  // its residual is p itself
    const ChiSquare r = chi_square(redraw_from_p, kP0, kP1, c.q0, c.q1, 200000);
    EXPECT_EQ(r.impossible, 0);  // it draws from p, only in the wrong proportions
    EXPECT_GT(r.statistic, chi_square_critical(r.dof));
  }
}

TEST(RejectionSampler, AGuessIsKeptWithProbabilityMinOfOneAndTheRatio) {
  const Dist p = dense({0.2, 0.8}), q = dense({0.5, 0.5});
  EXPECT_TRUE(keep_guess(p, q, 1, 0.999));  // p >= q: always
  EXPECT_TRUE(keep_guess(p, q, 0, 0.399));  // 0.2 / 0.5 = 0.4
  EXPECT_FALSE(keep_guess(p, q, 0, 0.401));
  EXPECT_FALSE(keep_guess(p, q, 5, 0.0));  // p gives it nothing
  // The residual of a rejected token 0: max(0, p - q) = {1: 0.3}.
  EXPECT_EQ(draw_residual(p, q, 0.0), 1);
  EXPECT_EQ(draw_residual(p, q, 0.999), 1);
  // p = q: nothing left over; the draw falls back to p.
  EXPECT_EQ(draw_residual(p, p, 0.1), 0);
  EXPECT_EQ(draw_residual(p, p, 0.5), 1);
}

TEST(RejectionSampler, DrawsAndLookups) {
  const Dist d = {{2, 0.25}, {7, 0.5}, {9, 0.25}};
  EXPECT_EQ(probability_of(d, 7), 0.5);
  EXPECT_EQ(probability_of(d, 3), 0.0);
  EXPECT_EQ(probability_of(d, 10), 0.0);
  EXPECT_EQ(draw_from(d, 0.0), 2);
  EXPECT_EQ(draw_from(d, 0.25), 7);
  EXPECT_EQ(draw_from(d, 0.74), 7);
  EXPECT_EQ(draw_from(d, 0.75), 9);
  EXPECT_EQ(draw_from({}, 0.5), -1);
  // The streams differ from the plain one and from each other.
  EXPECT_NE(stream_seed(1, SpecStream::kDraft), stream_seed(1, SpecStream::kAccept));
  EXPECT_NE(stream_seed(1, SpecStream::kAccept), 1u);
}

}  // namespace
}  // namespace pagellm
