#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

namespace pagellm {
namespace {

TEST(BlockPool, FreshPoolHandsOutBlocksInOrderUntilEmpty) {
  BlockPool pool(4, 16, /*paranoid=*/true);
  EXPECT_EQ(pool.n_free(), 4);
  for (BlockId want = 0; want < 4; ++want) EXPECT_EQ(pool.allocate(), want);
  EXPECT_EQ(pool.allocate(), kNoBlock);
  EXPECT_EQ(pool.n_used(), 4);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, ForkAndFreeCountReferences) {
  BlockPool pool(3, 16, true);
  BlockId b = pool.allocate();
  pool.fork(b);
  pool.fork(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  EXPECT_FALSE(pool.free(b));
  EXPECT_FALSE(pool.free(b));
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_TRUE(pool.free(b));
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_TRUE(pool.is_free(b));
}

TEST(BlockPool, FreeEndsAndReviveKeepListOrder) {
  BlockPool pool(5, 16, true);
  std::vector<BlockId> b;
  for (int i = 0; i < 5; ++i) b.push_back(pool.allocate());
  pool.free(b[2], BlockPool::FreeEnd::kBack);
  pool.free(b[0], BlockPool::FreeEnd::kBack);
  pool.free(b[4], BlockPool::FreeEnd::kFront);
  pool.free(b[1], BlockPool::FreeEnd::kBack);
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{4, 2, 0, 1}));
  pool.revive(0);  // out of the middle
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{4, 2, 1}));
  pool.revive(1);  // the tail
  pool.revive(4);  // the head
  EXPECT_EQ(pool.free_list(), (std::vector<BlockId>{2}));
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), kNoBlock);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPoolDeathTest, DoubleFreeAndBadIdsAreProgrammerErrors) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2, 16, true);
  BlockId b = pool.allocate();
  pool.free(b);
  EXPECT_DEATH(pool.free(b), "double free");
  EXPECT_DEATH(pool.fork(1), "fork of a free block");
  EXPECT_DEATH(pool.ref_count(7), "out of range");
  EXPECT_DEATH(BlockPool(0, 16), "n_blocks >= 1");
}

// Random operations against a naive model: refcounts in a vector, the free list in a deque.
TEST(BlockPool, RandomOperationsMatchANaiveModel) {
  const unsigned seed = 20240607;
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  const int n = 37;
  BlockPool pool(n, 16, true);
  std::vector<int> ref(n, 0);
  std::deque<BlockId> free_list;
  for (int i = 0; i < n; ++i) free_list.push_back(i);
  int checked = 0;
  for (int step = 0; step < 20000; ++step) {
    std::vector<BlockId> used;
    for (BlockId b = 0; b < n; ++b) {
      if (ref[b] > 0) used.push_back(b);
    }
    switch (rng() % 4) {
      case 0: {  // allocate
        BlockId got = pool.allocate();
        if (free_list.empty()) {
          ASSERT_EQ(got, kNoBlock);
        } else {
          ASSERT_EQ(got, free_list.front());
          free_list.pop_front();
          ref[got] = 1;
        }
        break;
      }
      case 1: {  // fork
        if (used.empty()) break;
        BlockId b = used[rng() % used.size()];
        pool.fork(b);
        ++ref[b];
        break;
      }
      case 2: {  // free to either end
        if (used.empty()) break;
        BlockId b = used[rng() % used.size()];
        bool back = rng() % 2;
        bool now_free = pool.free(b, back ? BlockPool::FreeEnd::kBack : BlockPool::FreeEnd::kFront);
        ASSERT_EQ(now_free, --ref[b] == 0);
        if (now_free) {
          if (back) free_list.push_back(b); else free_list.push_front(b);
        }
        break;
      }
      case 3: {  // revive a random free block
        if (free_list.empty()) break;
        size_t k = rng() % free_list.size();
        BlockId b = free_list[k];
        pool.revive(b);
        free_list.erase(free_list.begin() + k);
        ref[b] = 1;
        break;
      }
    }
    ASSERT_EQ(pool.free_list(), std::vector<BlockId>(free_list.begin(), free_list.end()));
    for (BlockId b = 0; b < n; ++b) ASSERT_EQ(pool.ref_count(b), ref[b]);
    ASSERT_TRUE(pool.check_invariants().ok());
    ++checked;
  }
  EXPECT_EQ(checked, 20000);
}

}  // namespace
}  // namespace pagellm
