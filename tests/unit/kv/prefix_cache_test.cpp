#include "kv/prefix_cache.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kv/block_manager.h"

namespace pagellm {
namespace {

std::vector<int32_t> iota_tokens(int n, int start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockHash, IsXxh3OfParentExtraAndTokens) {
  std::vector<int32_t> tokens = iota_tokens(16, 100);
  // Reference: the documented byte layout, hashed by the library directly.
  std::vector<unsigned char> buf(16 + tokens.size() * 4);
  uint64_t parent = 0x1234, extra = 0x99;
  std::memcpy(buf.data(), &parent, 8);
  std::memcpy(buf.data() + 8, &extra, 8);
  std::memcpy(buf.data() + 16, tokens.data(), tokens.size() * 4);
  EXPECT_EQ(hash_block(parent, extra, tokens), XXH3_64bits(buf.data(), buf.size()));
}

TEST(BlockHash, DependsOnEveryInput) {
  std::vector<int32_t> a = iota_tokens(16, 0);
  std::vector<int32_t> b = a;
  b[15] = 999;
  const BlockHash h = hash_block(0, 0, a);
  EXPECT_EQ(h, hash_block(0, 0, a));
  EXPECT_NE(h, hash_block(0, 0, b));
  EXPECT_NE(h, hash_block(1, 0, a));
  EXPECT_NE(h, hash_block(0, 1, a));
  const std::vector<uint64_t> lora7 = {7}, lora8 = {8};
  EXPECT_EQ(hash_extra_keys({}), 0u);
  EXPECT_NE(hash_extra_keys(lora7), hash_extra_keys(lora8));
}

TEST(PrefixCache, FindVerifiesTheWholeKey) {
  PrefixCache cache(4, 4);
  std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_TRUE(cache.insert(2, /*hash=*/42, /*parent=*/7, /*extra=*/0, t));
  EXPECT_EQ(cache.find(42, 7, 0, t), 2);
  // Same hash, different content (a forced collision): a miss, not wrong KV.
  std::vector<int32_t> other = {1, 2, 3, 5};
  EXPECT_EQ(cache.find(42, 7, 0, other), kNoBlock);
  EXPECT_EQ(cache.find(42, 8, 0, t), kNoBlock);
  EXPECT_EQ(cache.find(42, 7, 1, t), kNoBlock);
  EXPECT_EQ(cache.find(43, 7, 0, t), kNoBlock);
  // A second block with the same hash is not indexed; the first copy wins.
  EXPECT_FALSE(cache.insert(3, 42, 7, 0, t));
  EXPECT_FALSE(cache.insert(2, 50, 7, 0, t));  // already cached under 42
  EXPECT_TRUE(cache.evict(2));
  EXPECT_FALSE(cache.evict(2));
  EXPECT_EQ(cache.find(42, 7, 0, t), kNoBlock);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_TRUE(cache.check_invariants().ok());
}

// Registers blocks [first, first + n) of a chain of `tokens` as if one sequence computed them.
std::vector<BlockHash> chain_hashes(const std::vector<int32_t>& tokens, int bs, uint64_t extra) {
  std::vector<BlockHash> h;
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    h.push_back(hash_block(h.empty() ? 0 : h.back(), extra,
                           std::span<const int32_t>(tokens).subspan(i, bs)));
  }
  return h;
}

TEST(BlockManager, FreedCachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  const int bs = 4;
  BlockManager mgr({.n_blocks = 6, .block_size = bs, .enable_prefix_caching = true, .paranoid = true});
  // Three single-block "prompts" A, B, C, cached in blocks a, b, c.
  std::vector<std::vector<int32_t>> prompts = {iota_tokens(4, 0), iota_tokens(4, 10),
                                               iota_tokens(4, 20)};
  std::vector<BlockId> blocks;
  for (auto& p : prompts) {
    BlockId b = mgr.allocate();
    ASSERT_TRUE(mgr.register_block(b, chain_hashes(p, bs, 0)[0], 0, 0, p));
    blocks.push_back(b);
  }
  BlockId plain = mgr.allocate();  // never registered
  // Free in the order B, A, C, plain: LRU order among cached blocks is B, A, C; the uncached
  // block goes to the front and is reused first.
  mgr.release(blocks[1]);
  mgr.release(blocks[0]);
  mgr.release(blocks[2]);
  mgr.release(plain);
  EXPECT_EQ(mgr.n_free(), 6);
  auto hit = [&](int i) {
    std::vector<BlockId> out;
    mgr.match_prefix(chain_hashes(prompts[i], bs, 0), prompts[i], 0, 0, &out);
    return out.size() == 1;
  };
  // The two never-used blocks and `plain` come before any cached block.
  std::vector<BlockId> fresh = {mgr.allocate(), mgr.allocate(), mgr.allocate()};
  EXPECT_EQ(std::count(fresh.begin(), fresh.end(), plain), 1);
  EXPECT_TRUE(hit(0) && hit(1) && hit(2));
  EXPECT_EQ(mgr.allocate(), blocks[1]);  // B: least recently freed
  EXPECT_FALSE(hit(1));
  EXPECT_TRUE(hit(0) && hit(2));
  // A hit on A takes it off the free list and makes it live again; releasing it makes it the most
  // recent, so C is evicted next, then A.
  mgr.acquire(blocks[0]);
  mgr.release(blocks[0]);
  EXPECT_EQ(mgr.allocate(), blocks[2]);
  EXPECT_EQ(mgr.allocate(), blocks[0]);
  EXPECT_EQ(mgr.allocate(), kNoBlock);
  EXPECT_EQ(mgr.prefix_stats().evictions, 3);
  EXPECT_TRUE(mgr.check_invariants().ok());
}

TEST(BlockManager, PrefixCachingOffFindsAndRegistersNothing) {
  BlockManager mgr({.n_blocks = 2, .block_size = 4, .enable_prefix_caching = false, .paranoid = true});
  std::vector<int32_t> p = iota_tokens(4, 0);
  BlockId b = mgr.allocate();
  EXPECT_FALSE(mgr.register_block(b, chain_hashes(p, 4, 0)[0], 0, 0, p));
  std::vector<BlockId> out;
  mgr.match_prefix(chain_hashes(p, 4, 0), p, 0, 0, &out);
  EXPECT_TRUE(out.empty());
  mgr.record_lookup(4, 0);
  EXPECT_EQ(mgr.prefix_stats().queries, 0);
}

TEST(BlockManager, ValidateNamesTheField) {
  EXPECT_NE(BlockManager::validate({.n_blocks = 0}).message().find("n_blocks"), std::string::npos);
  EXPECT_NE(BlockManager::validate({.n_blocks = 4, .block_size = 0}).message().find("block_size"),
            std::string::npos);
  EXPECT_FALSE(BlockManager::validate({.n_blocks = 1 << 28, .block_size = 16}).ok());
  EXPECT_TRUE(BlockManager::validate({.n_blocks = 4}).ok());
}

}  // namespace
}  // namespace pagellm
