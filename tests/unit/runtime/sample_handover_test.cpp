// Backend's synchronous pipelined-sampling defaults (sample_async, sample_results,
// take_sampled_tokens), which the CPU backend and test doubles use: two calls may be unread at
// once, each ticket reads its own results, a step's negative token ids become the tokens of the
// rows they name (0 for a row that failed or does not exist), and a ticket whose slot was reused
// is refused.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "forwarding_backend.h"

namespace pagellm {
namespace {

// Answers row i of every call with token base + logits_row, and row 2 with a failure.
class FixedSampler final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  bool supports_sampling() const override { return true; }
  void sample(const Tensor&, const DeviceSampleInputs& in, DeviceSampleResult* out) override {
    for (int32_t i = 0; i < in.n_rows; ++i) {
      out[i] = DeviceSampleResult{};
      out[i].token = base + in.rows[i].logits_row;
      if (i == 2) {
        out[i].token = -1;
        out[i].status = DeviceSampleStatus::kNan;
      }
    }
    base += 100;
  }
  int32_t base = 100;
};

TEST(SampleHandover, TicketsReadTheirOwnRowsAndHandTheirTokensOver) {
  auto cpu = make_cpu_backend();
  FixedSampler b(*cpu);
  std::vector<float> logits(4 * 8, 0.0f);
  const Tensor l(logits.data(), DType::kF32, {4, 8});
  std::vector<DeviceSampleRow> rows(4);
  for (int32_t i = 0; i < 4; ++i) rows[i].logits_row = i;
  const uint64_t a = b.sample_async(l, {rows.data(), 4});  // tokens 100..103
  const uint64_t c = b.sample_async(l, {rows.data(), 3});  // tokens 200..202
  ASSERT_NE(a, c);

  std::vector<int32_t> ids = {-1, 5, -2, -3, -4, -5, 0};
  Tensor t(ids.data(), DType::kI32, {static_cast<int64_t>(ids.size())});
  b.take_sampled_tokens(t, a);
  EXPECT_EQ(ids,
            (std::vector<int32_t>{100, 5, 101, 0 /* row 2 failed */, 103, 0 /* no row 4 */, 0}));
  std::vector<int32_t> next = {-2, -1};
  Tensor u(next.data(), DType::kI32, {2});
  b.take_sampled_tokens(u, c);
  EXPECT_EQ(next, (std::vector<int32_t>{201, 200}));

  std::vector<DeviceSampleResult> ra(4), rc(3);
  b.sample_results(c, rc.data());  // out of order: each call keeps its own results
  b.sample_results(a, ra.data());
  EXPECT_EQ(ra[3].token, 103);
  EXPECT_EQ(ra[2].status, DeviceSampleStatus::kNan);
  EXPECT_EQ(rc[1].token, 201);

  // A third call reuses the first call's slot: that ticket is gone. (The CPU backend's pool has
  // threads: the death test re-executes the binary rather than fork it.)
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  (void)b.sample_async(l, {rows.data(), 1});
  EXPECT_DEATH(b.sample_results(a, ra.data()), "slot was reused");
}

}  // namespace
}  // namespace pagellm
