// The MLA/MoE architectures loaded with dummy weights (--load-format dummy): the latent KV
// geometry, and a prefill + decode that yields finite logits. The router and experts ops have their
// own tests (tests/unit/backend/cpu_moe_test.cpp, tests/ops/moe_test.cpp); the golden tests
// (golden_test.cpp) check the numbers end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "model/moe.h"
#include "runtime/sequence_runner.h"
#include "source_dir.h"

namespace pagellm {
namespace {

std::filesystem::path fixture_config(const std::string& name) {
  return std::filesystem::path(test_source_dir()) / "tests" / "data" / "golden" / name /
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
