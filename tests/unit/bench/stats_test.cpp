#include "bench/stats.h"

#include <gtest/gtest.h>

namespace pagellm::bench {
namespace {

// Reference values from numpy.percentile (default "linear" method).
TEST(Stats, PercentilesMatchNumpyLinear) {
  Summary s = summarize({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  EXPECT_EQ(s.n, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_NEAR(s.p50, 5.5, 1e-12);
  EXPECT_NEAR(s.p90, 9.1, 1e-12);
  EXPECT_NEAR(s.p99, 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(s.max, 10);
  Summary t = summarize({3, 1, 2});
  EXPECT_NEAR(t.p50, 2.0, 1e-12);
  EXPECT_NEAR(t.p90, 2.8, 1e-12);
  EXPECT_NEAR(t.p99, 2.98, 1e-12);
  Summary one = summarize({4});
  EXPECT_DOUBLE_EQ(one.p99, 4);
  Summary none = summarize({});
  EXPECT_EQ(none.n, 0);
  EXPECT_EQ(none.max, 0);
}

RequestResult ok_request(double ttft, double latency, int64_t out, int64_t in = 10) {
  RequestResult r;
  r.ok = true;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.output_tokens = out;
  r.prompt_tokens = in;
  return r;
}

TEST(Stats, TpotExcludesTheFirstToken) {
  EXPECT_NEAR(*tpot_s(ok_request(0.1, 1.0, 10)), 0.1, 1e-12);  // (1.0 - 0.1) / 9
  EXPECT_FALSE(tpot_s(ok_request(0.1, 0.1, 1)).has_value());
  RequestResult failed;
  EXPECT_FALSE(tpot_s(failed).has_value());
}

TEST(Stats, ParseSlo) {
  auto s = parse_slo("ttft=500,tpot=30");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s->ttft_ms, 500);
  EXPECT_EQ(*s->tpot_ms, 30);
  EXPECT_FALSE(s->e2el_ms);
  EXPECT_EQ(s->to_string(), "ttft=500,tpot=30");
  EXPECT_FALSE(parse_slo("ttft").ok());
  EXPECT_FALSE(parse_slo("ttft=-1").ok());
  EXPECT_FALSE(parse_slo("foo=3").ok());
  EXPECT_FALSE(parse_slo("ttft=3x").ok());
}

TEST(Stats, MetricsGoodputAndFailures) {
  std::vector<RequestResult> rs;
  rs.push_back(ok_request(0.2, 1.1, 10, 100));  // TTFT 200 ms, TPOT 100 ms
  rs.push_back(ok_request(0.6, 1.5, 10, 100));  // TTFT 600 ms: misses the TTFT bound
  rs.push_back(ok_request(0.1, 2.8, 10, 100));  // TPOT 300 ms: misses the TPOT bound
  rs.push_back(ok_request(0.3, 0.3, 1, 100));   // one token: TPOT undefined, holds trivially
  RequestResult f;
  f.error_kind = "stalled";
  rs.push_back(f);
  f.error_kind = "http_500";
  rs.push_back(f);
  rs.push_back(f);
  Slo slo = *parse_slo("ttft=500,tpot=150");
  BenchMetrics m = compute_metrics(rs, 2.0, slo);
  EXPECT_EQ(m.completed, 4);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.failures["stalled"], 1);
  EXPECT_EQ(m.failures["http_500"], 2);
  EXPECT_EQ(m.total_input_tokens, 400);
  EXPECT_EQ(m.total_output_tokens, 31);
  EXPECT_DOUBLE_EQ(m.request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 15.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 215.5);
  EXPECT_EQ(m.n_good, 2);
  EXPECT_DOUBLE_EQ(m.goodput, 1.0);
  EXPECT_EQ(m.tpot_ms.n, 3);
  EXPECT_NEAR(m.tpot_ms.p50, 100.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.mean, 300.0, 1e-9);
  // Without an SLO every completed request is good.
  EXPECT_EQ(compute_metrics(rs, 2.0, Slo{}).n_good, 4);
}

TEST(Stats, ItlPooledOverRequests) {
  RequestResult a = ok_request(0.1, 0.4, 4), b = ok_request(0.1, 0.3, 3);
  a.itl_s = {0.1, 0.1, 0.1};
  b.itl_s = {0.05, 0.15};
  BenchMetrics m = compute_metrics({a, b}, 1.0, Slo{});
  EXPECT_EQ(m.itl_ms.n, 5);
  EXPECT_NEAR(m.itl_ms.mean, 100.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.max, 150.0, 1e-9);
}

}  // namespace
}  // namespace pagellm::bench
