// DeepSeek's attention runs in two forms within one step (src/model/deepseek_v2.cpp): decodes and
// continued prefills against the latent cache (absorbed), prompts starting this step on their own
// per-head keys and values (expanded). The golden tests check each form against transformers one
// sequence at a time; this one runs many requests through the engine at once with a small token
// budget, so steps mix decodes, continued chunks and new prompts, and checks every request's
// greedy tokens and logprobs against the same request run alone.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "../unit/runtime/engine_test_util.h"
#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "source_dir.h"

namespace pagellm {
namespace {

class DeepseekMlaSplitTest : public testing::TestWithParam<const char*> {};

TEST_P(DeepseekMlaSplitTest, MixedStepsMatchRequestsRunAlone) {
  auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/" + GetParam());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto backend = make_cpu_backend();
  auto model = load_model(*ckpt, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto make_engine = [&](int32_t max_num_seqs, int32_t budget) {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = max_num_seqs;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.kv_cache_memory = 4 << 20;
    cfg.scheduler.paranoid = true;
    auto e = Engine::create(**model, *backend, nullptr, cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
  };
  constexpr int kRequests = 10, kTokens = 8;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(random_prompt(rng, 5 + (i * 7) % 31));

  // Together with 40 tokens a step: the first prompts finish their prefill while later ones are
  // admitted, so a step holds decodes, a prompt's continued chunk and new prompts together.
  auto solo = make_engine(64, 64);
  auto e = make_engine(kRequests, 40);
  ASSERT_TRUE(solo != nullptr && e != nullptr);
  auto [alone, together] = run_alone_and_together(*solo, *e, prompts, kTokens);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(together[i].tokens[0].size(), static_cast<size_t>(kTokens)) << "request " << i;
    EXPECT_EQ(together[i].tokens[0], alone[i].tokens[0]) << "request " << i;
    ASSERT_EQ(together[i].logprobs[0].size(), alone[i].logprobs[0].size());
    // The two forms sum in different orders (f32 on the CPU): equal to rounding.
    for (size_t k = 0; k < alone[i].logprobs[0].size(); ++k)
      EXPECT_NEAR(together[i].logprobs[0][k], alone[i].logprobs[0][k], 1e-3) << i << " " << k;
  }
  EXPECT_EQ(e->stats().scheduler.kv_usage, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekMlaSplitTest,
                         testing::Values("deepseek_v2", "deepseek_v2_qlora", "deepseek_v3"));

}  // namespace
}  // namespace pagellm
