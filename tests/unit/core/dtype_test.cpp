#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace pagellm {
namespace {

TEST(DType, Bf16RoundTripIsNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 ties up to the even mantissa 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesKnownEncodings) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), 5.9604645e-8f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  // Every finite f16 survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DType, QuantizedRoundTripWithinHalfAStep) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(32 * 7), y(x.size());
  for (float& v : x) v = dist(rng);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<uint8_t> q(dtype_bytes(t, x.size()));
    from_f32(t, x.data(), q.data(), x.size());
    to_f32(t, q.data(), y.data(), x.size());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float lo = x[b * 32], hi = lo, amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // One quantization step: range/127 (q8), 2*amax/15 (q4_0: 16 levels over +-amax, scale
      // rounded to f16), range/15 (q4_1). Error is at most half a step plus f16 rounding of d/m.
      const float step = t == DType::kQ8_0 ? amax / 127 : t == DType::kQ4_0 ? amax / 8 : (hi - lo) / 15;
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), 0.5f * step * 1.01f + 2e-3f)
            << dtype_name(t) << " block " << b << " elem " << j;
    }
  }
}

// The I4G types quantize each group with its min and max (AWQ's round-to-nearest): every value
// lands within half a step of the group's range / 15, the scale rounded to f16.
TEST(DType, GroupInt4RoundTripWithinHalfAStep) {
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.3f, 1.0f);
  for (DType t : {DType::kI4G32, DType::kI4G64, DType::kI4G128}) {
    const int g = block_elems(t);
    std::vector<float> x(g * 5), y(x.size());
    for (float& v : x) v = dist(rng);
    std::vector<uint8_t> q(dtype_bytes(t, x.size()));
    ASSERT_EQ(q.size(), x.size() / g * (4 + g / 2));
    from_f32(t, x.data(), q.data(), x.size());
    to_f32(t, q.data(), y.data(), x.size());
    for (size_t b = 0; b < x.size() / g; ++b) {
      const auto [lo, hi] = std::minmax_element(x.begin() + b * g, x.begin() + (b + 1) * g);
      const float step = (*hi - *lo) / 15;
      for (int j = 0; j < g; ++j)
        ASSERT_LE(std::fabs(x[b * g + j] - y[b * g + j]), 0.5f * step * 1.01f + 1e-3f)
            << dtype_name(t) << " group " << b << " elem " << j;
      EXPECT_LE(q[b * (4 + g / 2) + 2], 15);  // the zero point
    }
  }
}

// d * (q - z) exactly, for each nibble position of the layout (value 32c + j in the low nibble
// of qs[16c + j], 32c + j + 16 in its high nibble).
TEST(DType, GroupInt4Layout) {
  BlockI4G<64> b{};
  b.d = f32_to_f16(0.5f);
  b.z = 3;
  for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  float y[64];
  to_f32(DType::kI4G64, &b, y, 64);
  for (int c = 0; c < 2; ++c)
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[32 * c + j], 0.5f * (j - 3));
      EXPECT_EQ(y[32 * c + j + 16], 0.5f * (15 - j - 3));
    }
}

}  // namespace
}  // namespace pagellm
