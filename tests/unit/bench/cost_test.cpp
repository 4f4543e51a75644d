#include "bench/cost.h"

#include <gtest/gtest.h>

#include <fstream>

#include "bench/prometheus.h"
#include "source_dir.h"

namespace pagellm::bench {
namespace {

TEST(Toml, SubsetParses) {
  auto kv = parse_toml_subset(
      "# top comment\n"
      "title = \"prices\"  # trailing comment\n"
      "[usd_per_hour]\n"
      "H200 = 3.5\n"
      "\"H100 SXM\" = 2_5.0\n"
      "flag = true\n",
      "t.toml");
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  EXPECT_EQ(std::get<std::string>(kv->at("title")), "prices");
  EXPECT_EQ(std::get<double>(kv->at("usd_per_hour.H200")), 3.5);
  EXPECT_EQ(std::get<double>(kv->at("usd_per_hour.H100 SXM")), 25.0);
  EXPECT_EQ(std::get<bool>(kv->at("usd_per_hour.flag")), true);
}

TEST(Toml, ErrorsNameTheLine) {
  auto a = parse_toml_subset("[s]\nkey 3\n", "p.toml");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("p.toml:2"), std::string::npos) << a.status().message();
  EXPECT_FALSE(parse_toml_subset("[s\n", "p").ok());
  EXPECT_FALSE(parse_toml_subset("a = 1\na = 2\n", "p").ok());
  EXPECT_FALSE(parse_toml_subset("a = 1 2\n", "p").ok());
  EXPECT_FALSE(parse_toml_subset("a = \"open\n", "p").ok());
  EXPECT_FALSE(parse_toml_subset("a = nope\n", "p").ok());
}

TEST(Cost, Arithmetic) {
  auto t = PriceTable::parse("[usd_per_hour]\nH200 = 3.6\n\"H100 SXM\" = 7.2\n", "p");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->usd_per_hour("h100-sxm"), 7.2);
  EXPECT_FALSE(t->usd_per_hour("B200").ok());
  CostInput in;
  in.label = "a";
  in.gpu = "H200";
  in.output_tokens_per_s = 1000;
  in.total_tokens_per_s = 3000;
  auto r = compute_cost(in, *t);
  ASSERT_TRUE(r.ok());
  // 1000 tok/s = 3.6e6 tok/h for $3.6/h: $1 per million output tokens.
  EXPECT_NEAR(r->usd_per_million_output, 1.0, 1e-12);
  EXPECT_NEAR(r->usd_per_million_total, 1.0 / 3, 1e-12);
  EXPECT_NEAR(r->output_tok_s_per_usd_hour, 1000 / 3.6, 1e-9);
  in.utilization = 0.5;
  in.n_gpus = 2;
  r = compute_cost(in, *t);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->usd_per_million_output, 4.0, 1e-12);  // twice the GPUs, half the use
  in.utilization = 0;
  EXPECT_FALSE(compute_cost(in, *t).ok());
}

TEST(Cost, TableRanksCheapestFirst) {
  auto t = PriceTable::parse("[usd_per_hour]\nA = 1\nB = 1\n", "p");
  ASSERT_TRUE(t.ok());
  CostInput a{"slow", "A", "bf16", 1, 1.0, 100, 200}, b{"fast", "B", "int4", 1, 1.0, 400, 800};
  std::string md = cost_markdown({*compute_cost(a, *t), *compute_cost(b, *t)});
  EXPECT_LT(md.find("| 1 | fast"), md.find("| 2 | slow")) << md;
}

TEST(Cost, ShippedPriceTableParses) {
  auto t = PriceTable::load(test_source_dir() + "/bench/prices.toml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (const char* g : {"H200", "H100 SXM", "A100 80GB", "L40S", "RTX 4090", "CPU core"})
    EXPECT_TRUE(t->usd_per_hour(g).ok()) << g;
}

TEST(Prometheus, ParsesAndDiffsHistograms) {
  const char* before =
      "# HELP vllm:time_to_first_token_seconds TTFT\n"
      "# TYPE vllm:time_to_first_token_seconds histogram\n"
      "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 1\n"
      "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.5\n"
      "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 2\n"
      "vllm:generation_tokens_total{model_name=\"a b}\"} 10\n";
  const char* after =
      "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 1.5\n"
      "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 6\n"
      "vllm:generation_tokens_total{model_name=\"a b}\"} 110 1700000000\n";
  auto b = parse_prometheus(before), a = parse_prometheus(after);
  ASSERT_TRUE(b.ok() && a.ok());
  HistogramDelta h = histogram_delta(*b, *a, "vllm:time_to_first_token_seconds");
  EXPECT_EQ(h.count, 4);
  EXPECT_DOUBLE_EQ(h.mean(), 0.25);
  EXPECT_EQ(counter_delta(*b, *a, "vllm:generation_tokens_total"), 100);
  EXPECT_EQ(histogram_delta(*b, *a, "vllm:absent").count, 0);
  EXPECT_FALSE(parse_prometheus("name{a=\"1\" 3\n").ok());
  EXPECT_FALSE(parse_prometheus("name x\n").ok());
}

}  // namespace
}  // namespace pagellm::bench
