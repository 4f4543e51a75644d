#include "bench/report.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pagellm::bench {
namespace {

RunReport run_at(double rate, int good, int bad) {
  RunReport r;
  r.request_rate = rate;
  r.arrival = "poisson";
  r.metrics.completed = good + bad;
  r.metrics.n_good = good;
  r.metrics.output_throughput = 10 * rate;
  return r;
}

TEST(Report, JsonHasTheSchemaFields) {
  std::vector<RequestResult> rs(2);
  rs[0].ok = true;
  rs[0].ttft_s = 0.1;
  rs[0].latency_s = 0.5;
  rs[0].output_tokens = 5;
  rs[0].itl_s = {0.1, 0.1, 0.1, 0.1};
  rs[1].error_kind = "dropped";
  RunReport r;
  r.request_rate = INFINITY;
  r.metrics = compute_metrics(rs, 1.0, Slo{});
  r.requests = rs;
  const nlohmann::json j = run_json(r, Slo{}, true);
  for (const char* k : {"request_throughput", "output_throughput", "total_token_throughput", "goodput", "completed",
                        "failed", "failures"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"})
    for (const char* s : {"mean", "p50", "p90", "p99", "max"}) EXPECT_TRUE(j[k].contains(s)) << k << "." << s;
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["failures"]["dropped"], 1);
  EXPECT_DOUBLE_EQ(j["tpot_ms"]["mean"].get<double>(), 100.0);
  EXPECT_EQ(j["requests"].size(), 2u);
  EXPECT_EQ(j["requests"][1]["error"], "dropped");
  EXPECT_FALSE(j.contains("server"));
  EXPECT_EQ(j["workload_seed"], 0u);
  EXPECT_FALSE(j.contains("dataset_first"));  // a synthetic workload
  r.workload_seed = 0x9e3779b97f4a7c15ull;   // seeds span all 64 bits
  r.dataset_first = 8;
  const nlohmann::json j2 = run_json(r, Slo{}, false);
  EXPECT_EQ(j2["workload_seed"].get<uint64_t>(), 0x9e3779b97f4a7c15ull);
  EXPECT_EQ(j2["dataset_first"], 8);
  const std::string md = run_markdown(r, Slo{});
  EXPECT_NE(md.find("| TTFT | 100.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("failed: dropped | 1"), std::string::npos) << md;
}

TEST(Report, ServerSideColumns) {
  PromSamples before = {{"vllm:time_to_first_token_seconds_sum", 1.0}, {"vllm:time_to_first_token_seconds_count", 2}};
  PromSamples after = {{"vllm:time_to_first_token_seconds_sum", 1.4}, {"vllm:time_to_first_token_seconds_count", 6},
                       {"vllm:time_per_output_token_seconds_sum", 0.2}, {"vllm:time_per_output_token_seconds_count", 10},
                       {"pagellm:engine_busy_seconds_total", 0.75}};
  ServerSideMetrics s = server_side_metrics(before, after);
  EXPECT_NEAR(s.ttft_s.mean(), 0.1, 1e-12);
  EXPECT_EQ(s.itl_s.count, 10);  // the older vLLM name is the fallback
  RunReport r = run_at(1, 1, 0);
  r.server = s;
  EXPECT_NEAR(run_json(r, Slo{}, false)["server"]["ttft"]["mean_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NE(run_markdown(r, Slo{}).find("| TTFT | 0.00 | 100.00 | 4 |"), std::string::npos) << run_markdown(r, Slo{});
  // Busy seconds over the run's wall time: the GPU busy fraction.
  r.metrics.duration_s = 1.5;
  EXPECT_NEAR(run_json(r, Slo{}, false)["server"]["busy_fraction"].get<double>(), 0.5, 1e-12);
  EXPECT_NE(run_markdown(r, Slo{}).find("| engine busy (GPU steps) | | 50.0% of the run |"), std::string::npos)
      << run_markdown(r, Slo{});
  // Speculative decoding's counters: 10 drafts of 40 tokens, 25 right.
  after["vllm:spec_decode_num_drafts_total"] = 10;
  after["vllm:spec_decode_num_draft_tokens_total"] = 40;
  after["vllm:spec_decode_num_accepted_tokens_total"] = 25;
  r.server = server_side_metrics(before, after);
  const nlohmann::json j = run_json(r, Slo{}, false)["server"];
  EXPECT_DOUBLE_EQ(j["spec_acceptance_rate"].get<double>(), 0.625);
  EXPECT_DOUBLE_EQ(j["spec_mean_accepted_length"].get<double>(), 3.5);
  EXPECT_NE(run_markdown(r, Slo{}).find("acceptance 62.5%, mean accepted length 3.50 | 10 |"),
            std::string::npos)
      << run_markdown(r, Slo{});
}

TEST(Report, BestRateMeetingSlo) {
  // Attainment 100%, 95%, 50%: the best rate reaching 90% is 4, even out of order.
  std::vector<RunReport> runs = {run_at(8, 10, 10), run_at(2, 20, 0), run_at(4, 19, 1)};
  EXPECT_EQ(*best_rate_meeting_slo(runs, 0.9), 4);
  EXPECT_EQ(*best_rate_meeting_slo(runs, 0.5), 8);
  EXPECT_FALSE(best_rate_meeting_slo({run_at(1, 1, 9)}, 0.9).has_value());
  EXPECT_NE(sweep_markdown(runs, Slo{}, 4.0, 0.9).find("90% of requests: 4 req/s"), std::string::npos);
}

}  // namespace
}  // namespace pagellm::bench
