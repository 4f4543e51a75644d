#include "sample/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "sample/sample_rng.h"

namespace pagellm {
namespace {

// Expects validate() to fail with invalid_argument and a message naming `field`.
void expect_rejects(const std::function<void(SamplingParams&)>& edit, const std::string& field,
                    int32_t vocab = 0) {
  SamplingParams p;
  edit(p);
  Status st = p.validate(vocab);
  ASSERT_FALSE(st.ok()) << "expected '" << field << "' to be rejected";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'" + field + "'"), std::string::npos) << st.message();
}

TEST(SamplingParams, DefaultsAreValid) {
  SamplingParams p;
  EXPECT_TRUE(p.validate().ok());
  EXPECT_TRUE(p.validate(32000).ok());
  EXPECT_FALSE(p.is_greedy());
  EXPECT_FALSE(p.has_penalties());
}

TEST(SamplingParams, AcceptsBoundaryValues) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 0.5f;
  p.logit_bias = {{0, -100.0f}, {31999, 100.0f}};
  p.logprobs = 20;
  p.prompt_logprobs = 0;
  p.stop_token_ids = {0, 31999};
  p.max_tokens = 1;
  p.min_tokens = 1;
  p.n = 128;
  EXPECT_TRUE(p.validate(32000).ok()) << p.validate(32000).to_string();
  EXPECT_TRUE(p.is_greedy());
  EXPECT_TRUE(p.has_penalties());
  p.top_k = -1;
  p.temperature = 100.0f;
  EXPECT_TRUE(p.validate().ok());
}

TEST(SamplingParams, RejectsOutOfRangeFieldsNamingThem) {
  expect_rejects([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  expect_rejects([](SamplingParams& p) { p.temperature = 101.0f; }, "temperature");
  expect_rejects([](SamplingParams& p) { p.temperature = NAN; }, "temperature");
  expect_rejects([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_rejects([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_rejects([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p");
  expect_rejects([](SamplingParams& p) { p.top_p = NAN; }, "top_p");
  expect_rejects([](SamplingParams& p) { p.min_p = -0.01f; }, "min_p");
  expect_rejects([](SamplingParams& p) { p.min_p = 1.01f; }, "min_p");
  expect_rejects([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_rejects([](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty");
  expect_rejects([](SamplingParams& p) { p.repetition_penalty = INFINITY; },
                 "repetition_penalty");
  expect_rejects([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  expect_rejects([](SamplingParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty");
  expect_rejects([](SamplingParams& p) { p.frequency_penalty = NAN; }, "frequency_penalty");
  expect_rejects([](SamplingParams& p) { p.logit_bias = {{5, 100.5f}}; }, "logit_bias");
  expect_rejects([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias");
  expect_rejects([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }, "logit_bias", 100);
  expect_rejects([](SamplingParams& p) { p.logit_bias = {{3, 1.0f}, {4, 2.0f}, {3, 0.5f}}; },
                 "logit_bias");
  expect_rejects([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  expect_rejects([](SamplingParams& p) { p.logprobs = -1; }, "logprobs");
  expect_rejects([](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs");
  expect_rejects([](SamplingParams& p) { p.stop_token_ids = {-3}; }, "stop_token_ids");
  expect_rejects([](SamplingParams& p) { p.stop_token_ids = {7, 50}; }, "stop_token_ids", 50);
  expect_rejects([](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop");
  expect_rejects([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_rejects([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  expect_rejects(
      [](SamplingParams& p) {
        p.max_tokens = 4;
        p.min_tokens = 5;
      },
      "min_tokens");
  expect_rejects([](SamplingParams& p) { p.n = 0; }, "n");
  expect_rejects([](SamplingParams& p) { p.n = 129; }, "n");
}

TEST(SamplingParams, MessageCarriesTheValue) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(p.validate().message(), "sampling params: 'top_p' must be in (0, 1], got 1.5");
}

TEST(SampleRng, UniformIsDeterministicInRangeAndUnbiased) {
  constexpr int kDraws = 200000;
  double sum = 0.0;
  int below_tenth = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = uniform01(42, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, uniform01(42, static_cast<uint64_t>(i)));
    sum += u;
    below_tenth += u < 0.1;
  }
  // Mean of U(0,1) has sd 1/sqrt(12 n) = 6.5e-4; 6 sd (false failure ~2e-9) is 3.9e-3.
  EXPECT_NEAR(sum / kDraws, 0.5, 3.9e-3);
  // Binomial(n, 0.1) has sd sqrt(n*0.09) = 134; allow 6 sd.
  EXPECT_NEAR(below_tenth, kDraws / 10, 6 * 134);
  // Neighbouring seeds and steps give unrelated values.
  EXPECT_NE(uniform01(42, 0), uniform01(43, 0));
  EXPECT_NE(uniform01(42, 0), uniform01(42, 1));
  EXPECT_NE(random_bits(0, 1), random_bits(1, 0));
}

TEST(SampleRng, SequenceSeedsAndDrawnSeeds) {
  EXPECT_EQ(derive_sequence_seed(1234, 0), 1234u);
  EXPECT_NE(derive_sequence_seed(1234, 1), 1234u);
  EXPECT_NE(derive_sequence_seed(1234, 1), derive_sequence_seed(1234, 2));
  EXPECT_NE(derive_sequence_seed(1234, 1), derive_sequence_seed(1235, 1));
  const uint64_t a = draw_random_seed(), b = draw_random_seed();
  EXPECT_NE(a, b);
  // The constants are part of the contract (the CUDA sampler must agree): pin one value.
  static_assert(mix64(0) == 0xe220a8397b1dcdafull, "splitmix64 of 0");
}

}  // namespace
}  // namespace pagellm
