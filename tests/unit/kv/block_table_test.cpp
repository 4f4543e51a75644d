#include "kv/block_table.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pagellm {
namespace {

KvCacheConfig cfg(int n_blocks, int bs, bool prefix = true) {
  return {.n_blocks = n_blocks, .block_size = bs, .enable_prefix_caching = prefix, .paranoid = true};
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockTable, AllocatesOnDemandAndMapsSlots) {
  BlockManager mgr(cfg(8, 4));
  BlockTable t(4);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(t.n_blocks_needed(mgr, 0, 5), 2);
  t.prepare_write(mgr, 0, 5, &copies);
  EXPECT_EQ(t.blocks(), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(t.n_blocks_needed(mgr, 5, 8), 0);  // room left in block 1
  EXPECT_EQ(t.n_blocks_needed(mgr, 5, 9), 1);
  t.prepare_write(mgr, 5, 9, &copies);
  EXPECT_TRUE(copies.empty());
  // slot = block * block_size + offset
  EXPECT_EQ(t.slot(0), 0);
  EXPECT_EQ(t.slot(5), 1 * 4 + 1);
  EXPECT_EQ(t.slot(8), 2 * 4 + 0);
  EXPECT_EQ(mgr.n_used(), 3);
  t.release(mgr);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(mgr.n_free(), 8);
}

TEST(BlockTable, MaxWritableStopsAtTheFreeBlocks) {
  BlockManager mgr(cfg(8, 4));
  BlockTable t(4);
  std::vector<BlockCopy> copies;
  t.prepare_write(mgr, 0, 3, &copies);  // 1 block, 1 slot left in it
  EXPECT_EQ(t.max_writable(mgr, 3, 100, 0), 1);
  EXPECT_EQ(t.max_writable(mgr, 3, 100, 2), 9);
  EXPECT_EQ(t.max_writable(mgr, 3, 5, 2), 5);
}

TEST(BlockTable, ForkSharesAndWritingCopiesTheSharedPartialBlock) {
  BlockManager mgr(cfg(8, 4));
  BlockTable a(4);
  std::vector<BlockCopy> copies;
  a.prepare_write(mgr, 0, 6, &copies);  // blocks 0 (full), 1 (2 of 4 slots)
  BlockTable b = a.fork(mgr);
  BlockTable c = a.fork(mgr);
  EXPECT_EQ(mgr.ref_count(0), 3);
  EXPECT_EQ(mgr.ref_count(1), 3);
  // Each writer of position 6 while block 1 is shared gets its own copy of it.
  EXPECT_EQ(a.n_blocks_needed(mgr, 6, 7), 1);
  a.prepare_write(mgr, 6, 7, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0], (BlockCopy{1, a.blocks()[1]}));
  EXPECT_NE(a.blocks()[1], 1);
  EXPECT_EQ(a.blocks()[0], 0);  // the full block stays shared
  b.prepare_write(mgr, 6, 7, &copies);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[1].src, 1);
  // The last holder writes in place.
  EXPECT_EQ(mgr.ref_count(1), 1);
  EXPECT_EQ(c.n_blocks_needed(mgr, 6, 7), 0);
  c.prepare_write(mgr, 6, 7, &copies);
  EXPECT_EQ(copies.size(), 2u);
  EXPECT_EQ(c.blocks()[1], 1);
  EXPECT_EQ(mgr.ref_count(0), 3);
  // Slots of the three samples differ only in the copied block.
  EXPECT_NE(a.slot(6), b.slot(6));
  EXPECT_EQ(c.slot(6), 1 * 4 + 2);
  EXPECT_EQ(a.slot(0), c.slot(0));
  a.release(mgr);
  b.release(mgr);
  c.release(mgr);
  EXPECT_EQ(mgr.n_free(), 8);
  EXPECT_TRUE(mgr.check_invariants().ok());
}

TEST(BlockTable, SecondIdenticalPromptHitsAllFullBlocksButTheLast) {
  const int bs = 4;
  BlockManager mgr(cfg(16, bs));
  std::vector<int32_t> prompt = iota_tokens(12, 100);  // exactly 3 full blocks
  std::vector<BlockCopy> copies;

  BlockTable first(bs);
  std::vector<BlockId> hits;
  first.match_cached_prefix(mgr, prompt, 0, &hits);
  EXPECT_TRUE(hits.empty());
  first.prepare_write(mgr, 0, 12, &copies);
  first.register_computed(mgr, prompt, 12, 0);
  EXPECT_EQ(first.n_registered(), 3);
  for (BlockId b : first.blocks()) EXPECT_TRUE(mgr.is_cached(b));
  first.release(mgr);

  // Same prompt: all 3 blocks are cached, but the last is recomputed to produce logits.
  BlockTable second(bs);
  second.match_cached_prefix(mgr, prompt, 0, &hits);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(second.adopt_cached_prefix(mgr, hits), 8);
  EXPECT_EQ(second.n_blocks_needed(mgr, 8, 12), 1);

  // A longer prompt with the same start hits all 3 blocks.
  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  BlockTable third(bs);
  hits.clear();
  third.match_cached_prefix(mgr, longer, 0, &hits);
  EXPECT_EQ(hits.size(), 3u);
  // Different extra keys (another LoRA adapter): nothing.
  BlockTable fourth(bs);
  hits.clear();
  fourth.match_cached_prefix(mgr, longer, /*extra_hash=*/5, &hits);
  EXPECT_TRUE(hits.empty());
  // A prompt that differs in block 1 hits only block 0 (hashes chain).
  std::vector<int32_t> diverging = longer;
  diverging[5] = -1;
  hits.clear();
  BlockTable fifth(bs);  // a table's hashes belong to one sequence's tokens
  fifth.match_cached_prefix(mgr, diverging, 0, &hits);
  EXPECT_EQ(hits.size(), 1u);
  second.release(mgr);
  EXPECT_TRUE(mgr.check_invariants().ok());
}

TEST(BlockTable, ReleaseFreesTheTailFirstSoItIsEvictedFirst) {
  const int bs = 2;
  BlockManager mgr(cfg(3, bs));
  std::vector<int32_t> tokens = iota_tokens(6);
  BlockTable t(bs);
  std::vector<BlockCopy> copies;
  t.prepare_write(mgr, 0, 6, &copies);
  t.register_computed(mgr, tokens, 6, 0);
  std::vector<BlockId> blocks = t.blocks();
  t.release(mgr);
  EXPECT_EQ(mgr.pool().free_list(), (std::vector<BlockId>{blocks[2], blocks[1], blocks[0]}));
  // Evicting the tail block keeps the head findable.
  EXPECT_EQ(mgr.allocate(), blocks[2]);
  BlockTable again(bs);
  std::vector<BlockId> hits;
  again.match_cached_prefix(mgr, tokens, 0, &hits);
  EXPECT_EQ(hits, (std::vector<BlockId>{blocks[0], blocks[1]}));
}

TEST(BlockTable, SharePrefixThenMatchContinuesTheChain) {
  const int bs = 2;
  BlockManager mgr(cfg(8, bs));
  std::vector<int32_t> tokens = iota_tokens(7);
  BlockTable a(bs);
  std::vector<BlockCopy> copies;
  a.prepare_write(mgr, 0, 6, &copies);
  a.register_computed(mgr, tokens, 6, 0);
  BlockTable b(bs);
  b.share_prefix(mgr, a, 1);
  std::vector<BlockId> hits;
  b.match_cached_prefix(mgr, tokens, 0, &hits);
  EXPECT_EQ(hits, (std::vector<BlockId>{a.blocks()[1], a.blocks()[2]}));
  EXPECT_EQ(b.adopt_cached_prefix(mgr, hits), 6);
  EXPECT_EQ(b.blocks(), a.blocks());
  EXPECT_EQ(mgr.ref_count(a.blocks()[0]), 2);
  a.release(mgr);
  b.release(mgr);
  EXPECT_EQ(mgr.n_free(), 8);
}

}  // namespace
}  // namespace pagellm
