// The CPU communicator: every collective, with 1 to 4 ranks on threads of their own, against the
// same computation done serially; the ranks' reductions are bit-for-bit equal; many collectives
// back to back (the barriers keep one call's buffers from the next's); all_to_all with uneven
// counts, zeros among them.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "dist/cpu_communicator.h"

namespace pagellm {
namespace {

// Runs fn(communicator) on one thread per rank.
void on_ranks(int n, const std::function<void(Communicator&)>& fn) {
  auto comms = make_cpu_communicators(n);
  std::vector<std::thread> threads;
  for (auto& c : comms) threads.emplace_back([&fn, &c] { fn(*c); });
  for (auto& t : threads) t.join();
}

// Rank r's values: deterministic, different per rank and call, not exactly representable sums.
std::vector<float> values(int rank, int call, int64_t n) {
  std::mt19937 rng(1000 * rank + call);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor view(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

class CpuCommunicatorTest : public testing::TestWithParam<int> {};

TEST_P(CpuCommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  const int n_ranks = GetParam();
  for (int64_t n : {1, 7, 1000}) {
    std::vector<std::vector<float>> got(n_ranks);
    on_ranks(n_ranks, [&](Communicator& c) {
      for (int call = 0; call < 5; ++call) {  // back to back
        std::vector<float> v = values(c.rank(), call, n);
        Tensor t = view(v);
        c.all_reduce(t);
        if (call == 4) got[c.rank()] = v;
      }
    });
    std::vector<float> want(n, 0.0f);
    for (int r = 0; r < n_ranks; ++r) {
      const std::vector<float> v = values(r, 4, n);
      for (int64_t i = 0; i < n; ++i) want[i] = r == 0 ? v[i] : want[i] + v[i];
    }
    for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(got[r], want) << "rank " << r << ", n " << n;
  }
}

TEST_P(CpuCommunicatorTest, AllGatherAndReduceScatter) {
  const int n_ranks = GetParam();
  const int64_t n = 13;
  std::vector<std::vector<float>> gathered(n_ranks), scattered(n_ranks);
  on_ranks(n_ranks, [&](Communicator& c) {
    std::vector<float> in = values(c.rank(), 0, n), out(n * n_ranks);
    Tensor ti = view(in), to = view(out);
    c.all_gather(ti, to);
    gathered[c.rank()] = out;
    std::vector<float> big = values(c.rank(), 1, n * n_ranks), part(n);
    Tensor tb = view(big), tp = view(part);
    c.reduce_scatter(tb, tp);
    scattered[c.rank()] = part;
  });
  std::vector<float> all;
  for (int r = 0; r < n_ranks; ++r) {
    const std::vector<float> v = values(r, 0, n);
    all.insert(all.end(), v.begin(), v.end());
  }
  for (int r = 0; r < n_ranks; ++r) {
    EXPECT_EQ(gathered[r], all) << "rank " << r;
    std::vector<float> want(n);
    for (int q = 0; q < n_ranks; ++q) {
      const std::vector<float> v = values(q, 1, n * n_ranks);
      for (int64_t i = 0; i < n; ++i) want[i] = q == 0 ? v[r * n + i] : want[i] + v[r * n + i];
    }
    EXPECT_EQ(scattered[r], want) << "rank " << r;
  }
}

// Rank r sends (r + j) % 3 rows to rank j (so some send none), each row 3 int32s naming
// (source, destination, index).
TEST_P(CpuCommunicatorTest, AllToAllMovesRowsBySourceAndDestination) {
  const int n_ranks = GetParam();
  auto rows = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  std::vector<std::vector<int32_t>> got(n_ranks);
  on_ranks(n_ranks, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<int64_t> send_counts(n_ranks), recv_counts(n_ranks);
    std::vector<int32_t> send;
    int64_t n_recv = 0;
    for (int j = 0; j < n_ranks; ++j) {
      send_counts[j] = rows(r, j);
      recv_counts[j] = rows(j, r);
      n_recv += recv_counts[j];
      for (int64_t i = 0; i < send_counts[j]; ++i)
        send.insert(send.end(), {r, j, static_cast<int32_t>(i)});
    }
    std::vector<int32_t> recv(3 * n_recv, -1);
    c.all_to_all(send.data(), send_counts, recv.data(), recv_counts, 3 * sizeof(int32_t));
    got[r] = recv;
  });
  for (int r = 0; r < n_ranks; ++r) {
    std::vector<int32_t> want;
    for (int q = 0; q < n_ranks; ++q)
      for (int64_t i = 0; i < rows(q, r); ++i)
        want.insert(want.end(), {q, r, static_cast<int32_t>(i)});
    EXPECT_EQ(got[r], want) << "rank " << r;
  }
}

TEST_P(CpuCommunicatorTest, BroadcastAndBarrier) {
  const int n_ranks = GetParam();
  std::vector<std::vector<float>> got(n_ranks);
  std::vector<int> arrived(n_ranks, 0);
  on_ranks(n_ranks, [&](Communicator& c) {
    const int root = n_ranks - 1;
    std::vector<float> v = c.rank() == root ? values(root, 9, 37) : std::vector<float>(37, 0.0f);
    c.broadcast(v.data(), static_cast<int64_t>(v.size() * sizeof(float)), root);
    got[c.rank()] = v;
    arrived[c.rank()] = 1;
    c.barrier();
    // Past the barrier every rank has arrived.
    for (int q = 0; q < n_ranks; ++q) EXPECT_EQ(arrived[q], 1);
  });
  for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(got[r], values(n_ranks - 1, 9, 37)) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpuCommunicatorTest, testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace pagellm
