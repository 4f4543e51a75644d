#include "bench/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>

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

// A prompt as one comparable value: its text, or its token ids.
std::string prompt_key(const BenchRequest& r) {
  if (!r.prompt_ids.empty()) {
    std::string k = "ids:";
    for (int32_t id : r.prompt_ids) k += std::to_string(id) + ",";
    return k;
  }
  return "text:" + r.prompt_text;
}

// Runs 0 .. n_runs - 1 of a spec: no prompt of one run may appear in another (a sweep whose
// rates repeated prompts would measure every rate after the first against a warm prefix cache).
void expect_disjoint_runs(const WorkloadSpec& spec, int n_runs) {
  std::map<std::string, int> owner;  // prompt -> the run that sent it
  for (int run = 0; run < n_runs; ++run) {
    auto w = make_workload(spec, run);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(w->requests.size()), spec.random.n);
    EXPECT_FALSE(w->reuses_entries) << spec.dataset << " run " << run;
    std::set<std::string> mine;
    for (const BenchRequest& r : w->requests) mine.insert(prompt_key(r));
    for (const std::string& k : mine) {
      auto [it, fresh] = owner.try_emplace(k, run);
      EXPECT_TRUE(fresh) << spec.dataset << ": run " << run << " repeats a prompt of run " << it->second;
    }
  }
  EXPECT_GT(owner.size(), 0u);
}

TEST(Workload, RunSeeds) {
  EXPECT_EQ(run_workload_seed(42, 0), 42u);  // run 0 is the single-run workload
  std::set<uint64_t> seen = {42};
  for (int64_t i = 1; i < 100; ++i) EXPECT_TRUE(seen.insert(run_workload_seed(42, i)).second) << i;
  EXPECT_NE(run_workload_seed(42, 1), run_workload_seed(43, 1));
  EXPECT_FALSE(make_workload(WorkloadSpec{}, -1).ok());
}

TEST(Workload, EveryRunOfASweepDrawsItsOwnRandomPrompts) {
  WorkloadSpec spec;
  spec.random.n = 50;
  spec.random.input = *parse_length_dist("uniform:8,40", 24, "i");
  spec.random.output = *parse_length_dist("fixed", 8, "o");
  spec.random.vocab_size = 32000;
  spec.random.seed = 7;
  // Run 0 sends exactly what a single run with the same seed sends.
  auto single = random_workload(spec.random);
  auto run0 = make_workload(spec, 0);
  ASSERT_TRUE(single.ok() && run0.ok());
  EXPECT_EQ(run0->seed, 7u);
  EXPECT_EQ(run0->first, -1);
  ASSERT_EQ(run0->requests.size(), single->size());
  for (size_t i = 0; i < single->size(); ++i) {
    EXPECT_EQ(run0->requests[i].prompt_ids, (*single)[i].prompt_ids);
    EXPECT_EQ(run0->requests[i].max_tokens, (*single)[i].max_tokens);
  }
  expect_disjoint_runs(spec, 4);
}

TEST(Workload, EveryRunOfASweepHasItsOwnSharedPrefixes) {
  WorkloadSpec spec;
  spec.dataset = "shared-prefix";
  spec.random.n = 12;
  spec.random.input = *parse_length_dist("fixed", 4, "i");
  spec.random.output = *parse_length_dist("fixed", 4, "o");
  spec.random.vocab_size = 32000;
  spec.n_prefixes = 3;
  spec.prefix_len = 64;
  expect_disjoint_runs(spec, 3);
  // Not only the suffixes: the long system prompts themselves differ between runs.
  auto a = make_workload(spec, 0), b = make_workload(spec, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const BenchRequest& x : a->requests)
    for (const BenchRequest& y : b->requests)
      EXPECT_FALSE(std::equal(x.prompt_ids.begin(), x.prompt_ids.begin() + 64, y.prompt_ids.begin()));
}

TEST(Workload, EveryRunOfASweepTakesItsOwnDatasetEntries) {
  std::string sharegpt = "[", jsonl;
  for (int i = 0; i < 12; ++i) {
    sharegpt += std::string(i ? "," : "") + R"({"conversations": [{"from": "human", "value": "question )" +
                std::to_string(i) + R"("}, {"from": "gpt", "value": "answer"}]})";
    jsonl += R"({"prompt": "line )" + std::to_string(i) + "\"}\n";
  }
  sharegpt += "]";
  for (const char* kind : {"sharegpt", "jsonl"}) {
    WorkloadSpec spec;
    spec.dataset = kind;
    spec.path = temp_file(std::string("sweep.") + kind, kind == std::string("jsonl") ? jsonl : sharegpt);
    spec.random.n = 4;
    spec.random.seed = 3;
    expect_disjoint_runs(spec, 3);  // 3 runs x 4 = the 12 entries
    auto w1 = make_workload(spec, 1);
    ASSERT_TRUE(w1.ok());
    EXPECT_EQ(w1->first, 4);
    EXPECT_EQ(w1->pool_size, 12);
    // A fourth run finds no fresh entry left, and says so.
    auto w3 = make_workload(spec, 3);
    ASSERT_TRUE(w3.ok());
    EXPECT_TRUE(w3->reuses_entries) << kind;
  }
  WorkloadSpec no_path;
  no_path.dataset = "jsonl";
  EXPECT_FALSE(make_workload(no_path, 0).ok());
  no_path.dataset = "csv";
  EXPECT_FALSE(make_workload(no_path, 0).ok());
}

}  // namespace
}  // namespace pagellm::bench
