// ProfilingBackend through whole models: on every golden fixture (tests/data/golden: each
// architecture, MLA and MoE included) the logits through the decorator are bit-identical to the
// CPU backend's, recording or not, and the recorded ops carry the step's real attention costs
// (KV tokens and causal query-key pairs from StepBatchBuilder's host-side totals).
#include "backend/profiling_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/sequence_runner.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

fs::path golden_dir() {
  return fs::path(test_source_dir()) / "tests" / "data" / "golden";
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(golden_dir()))
    if (fs::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A fixture loaded on one backend, with a runner over a private KV cache.
struct Loaded {
  LoadedCheckpoint ckpt;
  std::unique_ptr<Model> model;
  std::unique_ptr<SequenceRunner> runner;
};

void load(const std::string& name, Backend& backend, int32_t max_chunk, Loaded& out) {
  auto ckpt = open_checkpoint((golden_dir() / name).string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  out.ckpt = std::move(*ckpt);
  auto model = load_model(out.ckpt, backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  out.model = std::move(*model);
  out.runner = std::make_unique<SequenceRunner>(*out.model, backend, /*max_len=*/128, /*block_size=*/16, max_chunk);
}

std::vector<float> feed(SequenceRunner& r, const std::vector<int32_t>& tokens, LogitsWanted wanted) {
  auto lg = r.feed(tokens, wanted);
  EXPECT_TRUE(lg.ok()) << lg.status().to_string();
  return lg.ok() ? std::vector<float>(lg->begin(), lg->end()) : std::vector<float>{};
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ProfiledModel : public testing::TestWithParam<std::string> {};

TEST_P(ProfiledModel, LogitsAreBitIdenticalAndOpsAreRecorded) {
  std::ifstream f(golden_dir() / GetParam() / "reference.json");
  ASSERT_TRUE(f);
  const auto ref = nlohmann::json::parse(f);
  const auto prompt = ref["cases"][0]["prompt"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 2u);

  auto plain_backend = make_cpu_backend();
  ProfilingBackend prof(make_cpu_backend());
  Loaded plain, profiled;
  // Chunks of 13 tokens (the golden tests' choice) so a prefill chunk attends to cached blocks;
  // dynamic NTK needs one forward per prompt (its frequencies depend on the call's length).
  ASSERT_NO_FATAL_FAILURE(load(GetParam(), *plain_backend, 13, plain));
  const int32_t chunk = plain.model->config().rope.type == RopeType::kDynamic ? 128 : 13;
  plain.runner = std::make_unique<SequenceRunner>(*plain.model, *plain_backend, 128, 16, chunk);
  ASSERT_NO_FATAL_FAILURE(load(GetParam(), prof, chunk, profiled));

  // Prefill, then two decode steps: the first not recorded, the second recorded.
  const auto want_prefill = feed(*plain.runner, prompt, LogitsWanted::kAll);
  const auto want_d1 = feed(*plain.runner, {prompt[0]}, LogitsWanted::kLast);
  const auto want_d2 = feed(*plain.runner, {prompt[1]}, LogitsWanted::kLast);

  prof.start();
  const auto got_prefill = feed(*profiled.runner, prompt, LogitsWanted::kAll);
  const std::vector<OpSample> prefill_ops = prof.stop();
  const auto got_d1 = feed(*profiled.runner, {prompt[0]}, LogitsWanted::kLast);
  prof.start();
  const auto got_d2 = feed(*profiled.runner, {prompt[1]}, LogitsWanted::kLast);
  const std::vector<OpSample> decode_ops = prof.stop();

  EXPECT_TRUE(bit_equal(want_prefill, got_prefill)) << "prefill logits differ";
  EXPECT_TRUE(bit_equal(want_d1, got_d1)) << "unrecorded decode logits differ";
  EXPECT_TRUE(bit_equal(want_d2, got_d2)) << "recorded decode logits differ";

  // What was recorded: every op has a time and a cost; each forward call embeds once and runs
  // rope_store_kv and attention once per layer (DeepSeek's absorbed form as attention_project,
  // the attention with W_UV after it, one op); attention keys carry the chunk's query and KV
  // token counts from StepBatchBuilder's host-side totals.
  const int64_t n_layers = plain.model->kv_spec().n_layers;
  auto check = [&](const std::vector<OpSample>& ops, const std::vector<std::string>& want_attention_keys) {
    ASSERT_FALSE(ops.empty());
    std::map<std::string, int64_t> calls;
    std::map<std::string, int64_t> attention_keys;
    for (const OpSample& s : ops) {
      const bool attention = s.op == "attention" || s.op == "attention_project";
      ++calls[attention ? "attention" : s.op];
      EXPECT_GE(s.ms, 0.0) << s.op;
      EXPECT_GT(s.bytes, 0.0) << s.op << " " << s.shape;
      if (s.op == "matmul" || attention) {
        EXPECT_GT(s.flops, 0.0) << s.op << " " << s.shape;
      }
      if (attention) ++attention_keys[s.shape.substr(0, s.shape.find(" hq="))];
    }
    const int64_t n_calls = static_cast<int64_t>(want_attention_keys.size());
    EXPECT_EQ(calls["embedding"], n_calls);
    EXPECT_EQ(calls["attention"], n_calls * n_layers);
    EXPECT_EQ(calls["rope_store_kv"], n_calls * n_layers);
    EXPECT_GE(calls["copy_from_host"], n_calls) << "each step uploads its metadata";
    EXPECT_GE(calls["matmul"], 4 * n_layers * n_calls);
    for (const std::string& k : want_attention_keys) EXPECT_EQ(attention_keys[k], n_layers) << k;
  };
  const int64_t p = static_cast<int64_t>(prompt.size());
  std::vector<std::string> prefill_keys;
  for (int64_t start = 0; start < p; start += chunk) {
    const int64_t end = std::min<int64_t>(p, start + chunk);
    prefill_keys.push_back("seqs=1 q=" + std::to_string(end - start) + " kv=" + std::to_string(end));
  }
  {
    SCOPED_TRACE("prefill");
    check(prefill_ops, prefill_keys);
  }
  {
    SCOPED_TRACE("decode");
    // The second decode token sees the prompt and both decode tokens.
    check(decode_ops, {"seqs=1 q=1 kv=" + std::to_string(p + 2)});
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, ProfiledModel, testing::ValuesIn(fixture_names()));

// The attention flops of a step follow StepBatchBuilder's count of causal pairs exactly.
TEST(ProfiledModelCosts, AttentionFlopsFollowCausalPairs) {
  ProfilingBackend prof(make_cpu_backend());
  Loaded m;
  ASSERT_NO_FATAL_FAILURE(load("llama", prof, /*max_chunk=*/128, m));
  const ModelConfig& c = m.model->config();
  const int64_t hq = c.num_attention_heads, d = c.head_dim;
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i);
  prof.start();
  feed(*m.runner, prompt, LogitsWanted::kLast);
  const auto ops = prof.stop();
  int64_t n = 0;
  for (const OpSample& s : ops)
    if (s.op == "attention") {
      ++n;
      // 20 tokens from position 0: 1 + 2 + ... + 20 = 210 pairs; QK and PV of head dim d each.
      EXPECT_DOUBLE_EQ(s.flops, 2.0 * 210 * hq * (d + d)) << s.shape;
      EXPECT_NE(s.shape.find("seqs=1 q=20 kv=20 "), std::string::npos) << s.shape;
    }
  EXPECT_EQ(n, m.model->kv_spec().n_layers);
}

}  // namespace
}  // namespace pagellm
