// The MoE router against hand-computed cases of each topk_method, and the MLA/MoE architectures
// loaded with dummy weights (--load-format dummy): the latent KV geometry, and a prefill + decode
// that yields finite logits. The golden tests (golden_test.cpp) check the numbers end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "model/moe.h"
#include "runtime/sequence_runner.h"

namespace pagellm {
namespace {

ModelConfig moe_config(int64_t experts, int64_t top_k, MoeTopk method, MoeScoring scoring) {
  ModelConfig c;
  c.n_routed_experts = experts;
  c.num_experts_per_tok = top_k;
  c.topk_method = method;
  c.scoring_func = scoring;
  return c;
}

TEST(MoeRouting, MixtralSoftmaxTopKRenormalized) {
  ModelConfig c = moe_config(4, 2, MoeTopk::kGreedy, MoeScoring::kSoftmax);
  c.norm_topk_prob = true;
  const float logits[] = {0, 1, 2, 3, /* token 2 */ 3, -1, 0, 2.5f};
  MoeRouting r;
  route_tokens(c, logits, nullptr, 2, r);
  ASSERT_EQ(r.experts.size(), 4u);
  EXPECT_EQ(r.experts[0], 3);
  EXPECT_EQ(r.experts[1], 2);
  const double a = std::exp(3.0), b = std::exp(2.0);
  EXPECT_NEAR(r.weights[0], a / (a + b), 1e-6);
  EXPECT_NEAR(r.weights[1], b / (a + b), 1e-6);
  EXPECT_EQ(r.experts[2], 0);
  EXPECT_EQ(r.experts[3], 3);
  EXPECT_NEAR(r.weights[2] + r.weights[3], 1.0, 1e-6);
}

TEST(MoeRouting, DeepSeekV2GreedyKeepsSoftmaxMassAndScales) {
  ModelConfig c = moe_config(4, 2, MoeTopk::kGreedy, MoeScoring::kSoftmax);
  c.routed_scaling_factor = 1.5;
  const float logits[] = {0, 1, 2, 3};
  MoeRouting r;
  route_tokens(c, logits, nullptr, 1, r);
  double z = 0;
  for (float l : logits) z += std::exp(double{l});
  EXPECT_EQ(r.experts[0], 3);
  EXPECT_EQ(r.experts[1], 2);
  EXPECT_NEAR(r.weights[0], 1.5 * std::exp(3.0) / z, 1e-6);  // not renormalized
  EXPECT_NEAR(r.weights[1], 1.5 * std::exp(2.0) / z, 1e-6);
}

TEST(MoeRouting, GroupLimitedGreedyPicksWithinTheBestGroups) {
  // Groups of 2: g0 {5, 0} max 5, g1 {4, 4} max 4, g2 {0, 0} max 0, g3 {4.5, 0} max 4.5. Keeping
  // 2 groups (g0, g3), the top 3 are experts 0, 6 and then 1 (logit 0, in a kept group) rather
  // than 2 (logit 4, in a dropped group).
  ModelConfig c = moe_config(8, 3, MoeTopk::kGroupLimitedGreedy, MoeScoring::kSoftmax);
  c.n_group = 4;
  c.topk_group = 2;
  const float logits[] = {5, 0, 4, 4, 0, 0, 4.5f, 0};
  MoeRouting r;
  route_tokens(c, logits, nullptr, 1, r);
  EXPECT_EQ(r.experts[0], 0);
  EXPECT_EQ(r.experts[1], 6);
  EXPECT_EQ(r.experts[2], 1);  // a kept group's 0-logit expert beats the masked 4-logit ones
  c.topk_method = MoeTopk::kGreedy;
  route_tokens(c, logits, nullptr, 1, r);
  EXPECT_EQ(r.experts[2], 2);  // without groups, expert 2 would be third
}

TEST(MoeRouting, NoauxTcRanksGroupsByTopTwoOfBiasedScores) {
  // All sigmoid scores are 0.5. Biased: g0 {0.8, 0.0} (top-2 sum 0.8, max 0.8), g1 {0.7, 0.7}
  // (sum 1.4): g1 wins although expert 0 has the best biased score. The weight is the raw score.
  ModelConfig c = moe_config(4, 1, MoeTopk::kNoauxTc, MoeScoring::kSigmoid);
  c.n_group = 2;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  const float logits[] = {0, 0, 0, 0};
  const float bias[] = {0.3f, -0.5f, 0.2f, 0.2f};
  MoeRouting r;
  route_tokens(c, logits, bias, 1, r);
  EXPECT_EQ(r.experts[0], 2);
  EXPECT_NEAR(r.weights[0], 0.5 * 2.5, 1e-6);
  c.norm_topk_prob = true;
  route_tokens(c, logits, bias, 1, r);
  EXPECT_NEAR(r.weights[0], 1.0 * 2.5, 1e-6);
}

std::filesystem::path fixture_config(const std::string& name) {
  return std::filesystem::path(PAGELLM_SOURCE_DIR) / "tests" / "data" / "golden" / name /
         "config.json";
}

class DummyMoeModels : public testing::TestWithParam<std::string> {};

TEST_P(DummyMoeModels, LoadAndRun) {
  auto ckpt = open_dummy_checkpoint(fixture_config(GetParam()).string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto backend = make_cpu_backend();
  auto model = load_model(*ckpt, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& c = (*model)->config();
  const KvSpec kv = (*model)->kv_spec();
  if (c.kv_lora_rank > 0) {  // MLA: one latent row per token, V inside it
    EXPECT_EQ(kv.n_kv_heads, 1);
    EXPECT_EQ(kv.k_dim, c.kv_lora_rank + c.qk_rope_head_dim);
    EXPECT_EQ(kv.v_dim, 0);
  }
  EXPECT_LT((*model)->decode_weight_bytes(), (*model)->weight_bytes());
  SequenceRunner runner(**model, *backend, 64, 16, 13);
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + 7 * i % 200);
  auto lg = runner.feed(prompt, LogitsWanted::kLast);
  ASSERT_TRUE(lg.ok()) << lg.status().to_string();
  auto next = runner.feed(std::vector<int32_t>{5}, LogitsWanted::kLast);
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  ASSERT_EQ(next->size(), static_cast<size_t>(c.vocab_size));
  for (float v : *next) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Architectures, DummyMoeModels,
                         testing::Values("deepseek_v2", "deepseek_v2_qlora", "deepseek_v3",
                                         "mixtral"));

}  // namespace
}  // namespace pagellm
