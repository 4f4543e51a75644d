#include "bench/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

namespace pagellm::bench {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Workload, LengthDistributions) {
  std::mt19937_64 rng(5);
  auto fixed = parse_length_dist("fixed", 64, "--input-len-dist");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->sample(rng), 64);
  auto uni = parse_length_dist("uniform:10,20", 15, "--input-len-dist");
  ASSERT_TRUE(uni.ok());
  for (int i = 0; i < 1000; ++i) {
    const int64_t x = uni->sample(rng);
    EXPECT_GE(x, 10);
    EXPECT_LE(x, 20);
  }
  // Mean-preserving tails (clamping at 16x moves the mean by well under the tolerance here).
  for (const char* spec : {"lognormal:0.5", "pareto:3"}) {
    auto d = parse_length_dist(spec, 200, "--output-len-dist");
    ASSERT_TRUE(d.ok()) << spec;
    double sum = 0;
    const int n = 100000;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(d->sample(rng));
    EXPECT_NEAR(sum / n, 200, 200 * 0.03) << spec;
  }
  EXPECT_FALSE(parse_length_dist("uniform:5", 10, "--x").ok());
  EXPECT_FALSE(parse_length_dist("uniform:9,3", 10, "--x").ok());
  EXPECT_FALSE(parse_length_dist("pareto:1", 10, "--x").ok());
  EXPECT_FALSE(parse_length_dist("normal:1", 10, "--x").ok());
}

TEST(Workload, RandomAndSharedPrefix) {
  RandomWorkloadOptions o;
  o.n = 20;
  o.input = *parse_length_dist("fixed", 32, "i");
  o.output = *parse_length_dist("fixed", 8, "o");
  o.vocab_size = 500;
  auto w = random_workload(o);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->size(), 20u);
  for (const auto& r : *w) {
    EXPECT_EQ(r.prompt_ids.size(), 32u);
    EXPECT_EQ(r.prompt_len, 32);
    EXPECT_EQ(r.max_tokens, 8);
    for (int32_t id : r.prompt_ids) EXPECT_TRUE(id >= kFirstRandomId && id < 500);
  }
  SharedPrefixOptions s;
  s.base = o;
  s.n_prefixes = 3;
  s.prefix_len = 100;
  auto sp = shared_prefix_workload(s);
  ASSERT_TRUE(sp.ok());
  for (size_t i = 0; i < sp->size(); ++i) {
    ASSERT_EQ((*sp)[i].prompt_ids.size(), 132u);
    const auto& a = (*sp)[i].prompt_ids;
    const auto& b = (*sp)[i % 3].prompt_ids;
    EXPECT_TRUE(std::equal(a.begin(), a.begin() + 100, b.begin()));
  }
  EXPECT_FALSE(std::equal((*sp)[0].prompt_ids.begin(), (*sp)[0].prompt_ids.begin() + 100, (*sp)[1].prompt_ids.begin()));
}

TEST(Workload, ShareGpt) {
  const std::string path = temp_file("sharegpt.json", R"([
    {"id": "a", "conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "0123456789abcdef"}]},
    {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
    {"id": "c"}
  ])");
  auto w = sharegpt_workload(path, 3, 0, 1, estimate_tokens);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 3u);
  for (const auto& r : *w) {
    EXPECT_EQ(r.prompt_text, "Hello there");
    EXPECT_EQ(r.max_tokens, 4);  // 16 bytes at ~4 bytes per token
  }
  auto fixed = sharegpt_workload(path, 1, 7, 1, estimate_tokens);
  EXPECT_EQ((*fixed)[0].max_tokens, 7);
  EXPECT_FALSE(sharegpt_workload(temp_file("bad.json", "{"), 1, 0, 1, estimate_tokens).ok());
  EXPECT_FALSE(sharegpt_workload(temp_file("empty.json", "[]"), 1, 0, 1, estimate_tokens).ok());
  EXPECT_FALSE(sharegpt_workload("/nonexistent/x.json", 1, 0, 1, estimate_tokens).ok());
}

TEST(Workload, Jsonl) {
  const std::string path = temp_file("reqs.jsonl", "{\"prompt\": \"hi\", \"max_tokens\": 5}\n\n{\"prompt\": [1, 2, 3]}\n");
  auto w = jsonl_workload(path, 3, 16, estimate_tokens);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ((*w)[0].prompt_text, "hi");
  EXPECT_EQ((*w)[0].max_tokens, 5);
  EXPECT_EQ((*w)[1].prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ((*w)[1].max_tokens, 16);
  EXPECT_EQ((*w)[2].prompt_text, "hi");
  auto bad = jsonl_workload(temp_file("bad.jsonl", "{\"prompt\": \"x\"}\n{\"max_tokens\": 3}\n"), 1, 16, estimate_tokens);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace pagellm::bench
