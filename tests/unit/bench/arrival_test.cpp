#include "bench/arrival.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pagellm::bench {
namespace {

struct Moments {
  double mean, cv;
};

Moments gap_moments(const std::vector<double>& t) {
  double prev = 0, sum = 0, sq = 0;
  for (double x : t) {
    const double g = x - prev;
    EXPECT_GE(g, 0.0);
    prev = x;
    sum += g;
    sq += g * g;
  }
  const double n = static_cast<double>(t.size());
  const double mean = sum / n, var = sq / n - mean * mean;
  return {mean, std::sqrt(var) / mean};
}

constexpr int64_t kN = 200000;  // standard error of the CV estimate is well under 1% at this size

TEST(Arrival, PoissonHasTheRateAndCvOne) {
  ArrivalOptions o;
  o.kind = ArrivalKind::kPoisson;
  o.rate = 8;
  o.seed = 1;
  auto t = arrival_times(o, kN);
  ASSERT_TRUE(t.ok());
  const Moments m = gap_moments(*t);
  EXPECT_NEAR(m.mean, 1.0 / 8, 0.01 / 8);
  EXPECT_NEAR(m.cv, 1.0, 0.02);
}

TEST(Arrival, GammaCvIsOneOverSqrtShape) {
  for (double k : {0.25, 1.0, 4.0}) {
    ArrivalOptions o;
    o.kind = ArrivalKind::kGamma;
    o.rate = 5;
    o.burstiness = k;
    o.seed = 7;
    auto t = arrival_times(o, kN);
    ASSERT_TRUE(t.ok());
    const Moments m = gap_moments(*t);
    EXPECT_NEAR(m.mean, 0.2, 0.2 * 0.015) << "k=" << k;
    EXPECT_NEAR(m.cv, 1.0 / std::sqrt(k), 0.03 / std::sqrt(k)) << "k=" << k;
  }
}

TEST(Arrival, MixKeepsTheMeanRateAndIsBurstier) {
  ArrivalOptions o;
  o.kind = ArrivalKind::kMix;
  o.rate = 10;
  o.heavy_fraction = 0.3;
  // alpha 5: a finite fourth moment, so the sample variance settles at this size.
  const double a = 5.0;
  o.pareto_alpha = a;
  o.seed = 3;
  auto t = arrival_times(o, kN);
  ASSERT_TRUE(t.ok());
  const Moments m = gap_moments(*t);
  EXPECT_NEAR(m.mean, 0.1, 0.1 * 0.02);
  // Mixing Pareto gaps with exponentials of the same mean m gives (in units of m^2)
  // E[g^2] = 0.7 * 2 + 0.3 * alpha / (alpha - 2) * x_m^2 with x_m = (alpha - 1) / alpha.
  const double ex2 = 0.7 * 2 + 0.3 * a / (a - 2) * std::pow((a - 1) / a, 2);
  EXPECT_NEAR(m.cv, std::sqrt(ex2 - 1), 0.03);
}

TEST(Arrival, ConstantAndInfinite) {
  ArrivalOptions o;
  o.kind = ArrivalKind::kConstant;
  o.rate = 4;
  auto t = arrival_times(o, 5);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 5; ++i) EXPECT_NEAR((*t)[i], 0.25 * (i + 1), 1e-12);
  o.rate = INFINITY;
  auto z = arrival_times(o, 3);
  ASSERT_TRUE(z.ok());
  for (double x : *z) EXPECT_EQ(x, 0.0);
}

TEST(Arrival, SameSeedSameScheduleAndBadOptions) {
  ArrivalOptions o;
  o.rate = 3;
  o.seed = 42;
  EXPECT_EQ(*arrival_times(o, 100), *arrival_times(o, 100));
  o.seed = 43;
  ArrivalOptions p = o;
  p.seed = 42;
  EXPECT_NE(*arrival_times(o, 100), *arrival_times(p, 100));
  o.rate = 0;
  EXPECT_FALSE(arrival_times(o, 1).ok());
  o.rate = 1;
  o.kind = ArrivalKind::kGamma;
  o.burstiness = 0;
  EXPECT_FALSE(arrival_times(o, 1).ok());
  EXPECT_FALSE(parse_arrival_kind("bursty").ok());
  EXPECT_EQ(*parse_arrival_kind("gamma"), ArrivalKind::kGamma);
}

}  // namespace
}  // namespace pagellm::bench
