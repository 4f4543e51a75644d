#include "core/tensor.h"

#include <gtest/gtest.h>

#include <vector>

namespace pagellm {
namespace {

// q | k | v packed per row, as a fused projection writes them: q's heads must be addressable
// through the packed row stride.
TEST(TensorTest, SplitHeadsOfAColumnSliceKeepsTheRowStride) {
  constexpr int64_t kRows = 3, kQ = 2 * 4, kKv = 4, kWidth = kQ + 2 * kKv;
  std::vector<float> buf(kRows * kWidth);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  Tensor all(buf.data(), DType::kF32, {kRows, kWidth});
  Tensor k = all.slice_cols(kQ, kQ + kKv).split_heads(1, kKv);
  Tensor q = all.slice_cols(0, kQ).split_heads(2, 4);
  ASSERT_EQ(q.ndim, 3);
  EXPECT_EQ(q.size(0), kRows);
  EXPECT_EQ(q.size(1), 2);
  EXPECT_EQ(q.size(2), 4);
  EXPECT_EQ(q.stride[0], kWidth);
  EXPECT_FALSE(q.is_contiguous());
  // Element (row 2, head 1, dim 3) of q is column 1 * 4 + 3 of row 2.
  const float* p = static_cast<const float*>(q.data) + 2 * q.stride[0] + 1 * q.stride[1] + 3;
  EXPECT_EQ(*p, static_cast<float>(2 * kWidth + 7));
  const float* pk = static_cast<const float*>(k.data) + 1 * k.stride[0] + 2;
  EXPECT_EQ(*pk, static_cast<float>(1 * kWidth + kQ + 2));
}

TEST(TensorTest, SplitHeadsRejectsAWrongFactorization) {
  std::vector<float> buf(12);
  Tensor t(buf.data(), DType::kF32, {2, 6});
  EXPECT_DEATH(t.split_heads(4, 2), "");
}

}  // namespace
}  // namespace pagellm
