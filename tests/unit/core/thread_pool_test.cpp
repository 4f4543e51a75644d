// ThreadPool: every index of every loop runs exactly once, across many back-to-back loops (workers
// spinning between them), loops of every size against the thread count, and loops started from
// several threads at once.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace pagellm {
namespace {

void check_covers_once(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(n);
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    ASSERT_LE(0, b);
    ASSERT_LE(b, e);
    ASSERT_LE(e, n);
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
}

TEST(ThreadPool, EveryIndexOnceManyLoops) {
  ThreadPool pool(4);
  int loops = 0;
  for (int rep = 0; rep < 200; ++rep)
    for (int64_t n : {1, 2, 3, 4, 5, 7, 16, 100, 1001})
      for (int64_t grain : {1, 3, 64}) {
        check_covers_once(pool, n, grain);
        ++loops;
        if (HasFatalFailure()) return;
      }
  EXPECT_GT(loops, 0);
}

TEST(ThreadPool, SingleThreadAndEmpty) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.n_threads(), 1);
  check_covers_once(pool, 37, 1);
  int calls = 0;
  pool.parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, LoopsFromSeveralThreads) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 300; ++rep)
        pool.parallel_for(50, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 3 * 300 * 50);
}

}  // namespace
}  // namespace pagellm
