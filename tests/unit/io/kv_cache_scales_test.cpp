// FP8 KV cache scales from a checkpoint: per layer k_scale and v_scale, or one kv_scale; none at
// all; and the broken cases (a layer without them, half a pair, a bad value) as clear errors.
#include "io/kv_cache_scales.h"

#include <gtest/gtest.h>

#include <limits>

#include "memory_source.h"

namespace pagellm {
namespace {

std::string attn(int layer, const char* what) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + what;
}

void add_scalar(MemorySource& w, const std::string& name, float v) {
  w.add(name, DType::kF32, {}, std::vector<float>{v});
}

TEST(KvCacheScales, PerLayerPairsOrOneScaleForBoth) {
  MemorySource w;
  add_scalar(w, attn(0, "k_scale"), 0.5f);
  add_scalar(w, attn(0, "v_scale"), 0.25f);
  add_scalar(w, attn(1, "kv_scale"), 2.0f);
  auto s = read_kv_cache_scales(w, 2);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0], std::make_pair(0.5f, 0.25f));
  EXPECT_EQ((*s)[1], std::make_pair(2.0f, 2.0f));
}

TEST(KvCacheScales, NoneIsEmpty) {
  MemorySource w;
  w.add("model.embed_tokens.weight", DType::kF32, {1}, std::vector<float>{1.0f});
  auto s = read_kv_cache_scales(w, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->empty());
}

TEST(KvCacheScales, BrokenScalesAreClearErrors) {
  struct Case {
    const char* what;
    std::vector<std::pair<std::string, float>> scalars;
    const char* fragment;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"a layer without", {{attn(0, "kv_scale"), 1.0f}}, "1 of 2 layers"},
      {"half a pair", {{attn(0, "k_scale"), 1.0f}, {attn(1, "kv_scale"), 1.0f}}, "only one of"},
      {"zero", {{attn(0, "kv_scale"), 0.0f}, {attn(1, "kv_scale"), 1.0f}}, "positive and finite"},
      {"NaN",
       {{attn(0, "kv_scale"), 1.0f}, {attn(1, "k_scale"), nan}, {attn(1, "v_scale"), 1.0f}},
       "positive and finite"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    MemorySource w;
    for (const auto& [name, v] : c.scalars) add_scalar(w, name, v);
    auto s = read_kv_cache_scales(w, 2);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(c.fragment), std::string::npos) << s.status().to_string();
  }
  MemorySource w;  // not a scalar
  w.add(attn(0, "kv_scale"), DType::kF32, {2}, std::vector<float>{1.0f, 1.0f});
  auto s = read_kv_cache_scales(w, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("must be one float"), std::string::npos);
}

}  // namespace
}  // namespace pagellm
