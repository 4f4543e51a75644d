// Backend::batched_matmul's default (one matmul per batch entry, the CPU backend's path and the
// reference of the CUDA op tests) on the per-head views MLA uses, and its cost model: entry by
// entry it must equal the matmul of that entry's 2-D views, bit for bit, and leave every element
// outside the output view alone.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"

namespace pagellm {
namespace {

// A [batch, rows, cols] view of a flat f32 buffer with the given batch and row strides.
Tensor view3(std::vector<float>& buf, int64_t offset, int64_t batch, int64_t rows, int64_t cols,
             int64_t batch_stride, int64_t row_stride) {
  Tensor t(buf.data() + offset, DType::kF32, {batch, rows, cols});
  t.stride = {batch_stride, row_stride, 1, 0};
  return t;
}
// Entry b of such a view as a plain 2-D view.
Tensor entry2(std::vector<float>& buf, int64_t offset, int64_t rows, int64_t cols,
              int64_t row_stride) {
  Tensor t(buf.data() + offset, DType::kF32, {rows, cols});
  t.stride = {row_stride, 1, 0, 0};
  return t;
}

std::vector<float> random_values(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Shape {
  int64_t batch, n, k, m;
  int64_t x_bs, x_rs;         // x entry b row r at b * x_bs + r * x_rs
  int64_t w_bs, w_rs, w_off;  // w entry b row r at w_off + b * w_bs + r * w_rs
  int64_t o_bs, o_rs;         // out entry b row r at b * o_bs + r * o_rs
};

void check_against_matmuls(Backend& be, const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t nx = (s.batch - 1) * s.x_bs + (s.n - 1) * s.x_rs + s.k;
  const int64_t nw = s.w_off + (s.batch - 1) * s.w_bs + (s.m - 1) * s.w_rs + s.k;
  const int64_t no = (s.batch - 1) * s.o_bs + (s.n - 1) * s.o_rs + s.m;
  std::vector<float> x = random_values(rng, nx), w = random_values(rng, nw);
  constexpr float kUntouched = 12345.0f;
  std::vector<float> got(no, kUntouched), want(no, kUntouched);
  Tensor got_t = view3(got, 0, s.batch, s.n, s.m, s.o_bs, s.o_rs);
  be.batched_matmul(view3(x, 0, s.batch, s.n, s.k, s.x_bs, s.x_rs),
                    view3(w, s.w_off, s.batch, s.m, s.k, s.w_bs, s.w_rs), got_t);
  for (int64_t b = 0; b < s.batch; ++b) {
    Tensor ob = entry2(want, b * s.o_bs, s.n, s.m, s.o_rs);
    be.matmul(entry2(x, b * s.x_bs, s.n, s.k, s.x_rs),
              entry2(w, s.w_off + b * s.w_bs, s.m, s.k, s.w_rs), Tensor(), ob);
  }
  int64_t written = 0;
  for (int64_t i = 0; i < no; ++i) {
    ASSERT_EQ(got[i], want[i]) << "element " << i << " of batch " << s.batch << " x [" << s.n
                               << ", " << s.k << "] . [" << s.m << ", " << s.k << "]^T";
    written += got[i] != kUntouched;
  }
  EXPECT_EQ(written, s.batch * s.n * s.m) << "the output view has batch * n * m elements";
}

TEST(BackendBatchedMatmul, DefaultIsOneMatmulPerEntry) {
  for (bool fast : {true, false}) {
    auto be = make_cpu_backend(fast);
    // MLA's absorbed query at the golden fixtures' shape: 4 heads of [n, 24] -> [n, 40].
    for (int64_t n : {1, 5, 13})
      check_against_matmuls(*be, {4, n, 24, 40, 24, 96, 40 * 24, 24, 0, 40, 160}, 1);
    // W_UV out of kv_b_proj's rows: 4 heads of [n, 32] x [16, 32]^T, entries 32 rows apart from
    // row 16 on.
    for (int64_t n : {1, 7})
      check_against_matmuls(*be, {4, n, 32, 16, 32, 128, 32 * 32, 32, 16 * 32, 16, 64}, 2);
    // A batch stride of 0 for x: every entry multiplies the same rows.
    check_against_matmuls(*be, {3, 6, 8, 5, 0, 8, 5 * 8, 8, 0, 5, 15}, 3);
  }
}

TEST(BackendBatchedMatmul, CostCountsEveryEntryAndABroadcastOperandOnce) {
  std::vector<float> buf(1 << 16);
  const Tensor x = view3(buf, 0, 16, 2, 192, 192, 16 * 192);
  const Tensor w = view3(buf, 0, 16, 576, 192, 576 * 192, 192);
  const Tensor out = view3(buf, 0, 16, 2, 576, 576, 16 * 576);
  const OpSample s = op_cost::batched_matmul(x, w, out);
  EXPECT_EQ(s.op, "batched_matmul");
  EXPECT_EQ(s.shape, "b=16 n=2 k=192 m=576 f32");
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 16 * 2 * 576 * 192);
  EXPECT_DOUBLE_EQ(s.bytes, 4.0 * (16 * 576 * 192 + 16 * 2 * 192 + 16 * 2 * 576));
  const Tensor x_once = view3(buf, 0, 16, 2, 192, 0, 192);
  const OpSample b = op_cost::batched_matmul(x_once, w, out);
  EXPECT_DOUBLE_EQ(b.bytes, 4.0 * (16 * 576 * 192 + 2 * 192 + 16 * 2 * 576));
}

TEST(BackendAttentionProject, CostIsTheAttentionsPlusTheProductsWeightsAndOutput) {
  // DeepSeek-V2-Lite's absorbed decode: 16 heads over the 576-wide latent row (V its last 512
  // columns), then W_UV [16, 128, 512] out of kv_b_proj's rows.
  std::vector<float> buf(1 << 16);
  AttentionMeta meta;
  meta.n_seqs = 1;
  meta.total_kv_tokens = 600;
  meta.total_qk_pairs = 600;
  Tensor kc(buf.data(), DType::kBF16, {40, 16, 1, 576});
  const Tensor vc = kc.slice_cols(64, 576);
  const Tensor q(buf.data() + 1000, DType::kBF16, {1, 16, 576});
  const Tensor attn(buf.data() + 2000, DType::kBF16, {1, 16, 512});
  Tensor w(buf.data() + 3000, DType::kBF16, {16, 128, 512});
  w.stride = {256 * 512, 512, 1, 0};
  const Tensor out(buf.data() + 4000, DType::kBF16, {1, 16, 128});
  const OpSample a = op_cost::attention(q, kc, vc, meta, attn);
  const OpSample s = op_cost::attention_project(q, kc, vc, meta, w, attn, out);
  EXPECT_EQ(s.op, "attention_project");
  EXPECT_EQ(s.shape, a.shape + " m=128 bf16");
  EXPECT_DOUBLE_EQ(s.bytes, a.bytes + 2.0 * (16 * 128 * 512 + 16 * 128));
  EXPECT_DOUBLE_EQ(s.flops, a.flops + 2.0 * 16 * 128 * 512);
}

}  // namespace
}  // namespace pagellm
