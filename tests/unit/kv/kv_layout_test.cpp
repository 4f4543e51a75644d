#include "kv/kv_layout.h"

#include <gtest/gtest.h>

namespace pagellm {
namespace {

TEST(KvLayout, GqaBytesPerBlockMatchesLlama3_8B) {
  // Llama-3-8B: 32 layers, 8 KV heads of 128; bf16. Per token per layer K + V = 2 * 8 * 128.
  KvLayout l = KvLayout::gqa(32, 8, 128);
  ASSERT_TRUE(l.validate().ok());
  EXPECT_EQ(l.elems_per_token_per_layer(), 2048);
  EXPECT_EQ(l.bytes_per_block(2), 2048 * 2 * 16 * 32);  // 2 MiB
  EXPECT_EQ(l.bytes_per_layer(10, 2), 2048 * 2 * 16 * 10);
  auto n = n_blocks_for_budget(l, 2, 10LL << 30);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5120);
}

TEST(KvLayout, MlaIsOneLatentRowPerToken) {
  // DeepSeek-V3: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64.
  KvLayout l = KvLayout::mla(61, 512, 64);
  ASSERT_TRUE(l.validate().ok());
  EXPECT_EQ(l.elems_per_token_per_layer(), 576);
  EXPECT_EQ(l.bytes_per_block(2), 576LL * 2 * 16 * 61);
  EXPECT_NE(l.describe(2).find("mla"), std::string::npos);
}

TEST(KvLayout, DifferentValueHeadDim) {
  KvLayout l = KvLayout::gqa(2, 4, 192, 16, 128);
  EXPECT_EQ(l.elems_per_token_per_layer(), 4 * 192 + 4 * 128);
}

TEST(KvLayout, BadFieldsAreNamed) {
  EXPECT_NE(KvLayout::gqa(0, 8, 128).validate().message().find("n_layers"), std::string::npos);
  EXPECT_NE(KvLayout::gqa(2, 0, 128).validate().message().find("n_kv_heads"), std::string::npos);
  EXPECT_NE(KvLayout::mla(2, 0, 64).validate().message().find("kv_lora_rank"), std::string::npos);
  EXPECT_FALSE(n_blocks_for_budget(KvLayout::gqa(2, 1, 8), 0, 1 << 20).ok());
}

TEST(KvLayout, BudgetSmallerThanOneBlockIsAnError) {
  auto n = n_blocks_for_budget(KvLayout::gqa(32, 8, 128), 2, 1 << 20);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(n.status().message().find("smaller than one block"), std::string::npos);
}

TEST(KvLayout, BlockCountIsCappedForI32Slots) {
  auto n = n_blocks_for_budget(KvLayout::gqa(1, 1, 1, 16), 1, 1LL << 40);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0x7fffffff / 16);
}

KvBudget util(double u) {
  KvBudget b;
  b.utilization = u;
  return b;
}

TEST(KvCacheBytes, ExplicitWinsElseUtilizationOfFreeMinusActivations) {
  auto e = kv_cache_bytes({.explicit_bytes = 123456, .utilization = 0.5}, 1000, 10);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, 123456);
  auto u = kv_cache_bytes(util(0.9), 1000, 100);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(*u, 800);
  EXPECT_EQ(kv_cache_bytes(util(0.0), 1000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_cache_bytes(util(1.5), 1000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_cache_bytes({.explicit_bytes = 0, .utilization = 0.9}, 1000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_cache_bytes(util(0.5), 1000, 600).status().code(),
            StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pagellm
