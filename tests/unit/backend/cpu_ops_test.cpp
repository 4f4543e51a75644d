// Row and elementwise ops, embedding, memory and weight upload of the CPU backend: the reference
// against naive double computations (rms_norm as Hugging Face's LlamaRMSNorm), every fast ISA path
// against the reference, aliasing and strided (column-slice) operands, guards after outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace pagellm::testing {
namespace {

// LlamaRMSNorm in double: x / sqrt(mean(x^2) + eps) * w.
std::vector<double> naive_rms_norm(const std::vector<float>& x, const std::vector<float>& w,
                                   int64_t n, int64_t d, float eps) {
  std::vector<double> out(n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t k = 0; k < d; ++k) ss += double(x[i * d + k]) * x[i * d + k];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t k = 0; k < d; ++k) out[i * d + k] = x[i * d + k] * inv * w[k];
  }
  return out;
}

// Norm outputs are O(1) (x ~ U(-2, 2), w ~ U(0.5, 1.5)): an f32 computation is within a few ulp.
constexpr double kNormTol = 2e-6;

TEST(CpuOps, RmsNormMatchesNaiveAndAliases) {
  int64_t checked = 0;
  uint32_t seed = 700;
  for (auto& [isa, be] : all_backends()) {
    for (int64_t n : {1, 7, 19}) {
      for (int64_t d : {64, 100, 4096}) {
        for (bool alias : {false, true}) {
          const std::string ctx = isa + " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                  (alias ? " in-place" : "") + " seed=" + std::to_string(++seed);
          std::mt19937 rng(seed);
          const float eps = 1e-6f;
          std::vector<float> x = random_floats(rng, n * d, -2.0f, 2.0f);
          std::vector<float> w = random_floats(rng, d, 0.5f, 1.5f);
          const std::vector<double> want = naive_rms_norm(x, w, n, d, eps);
          GuardedBuffer buf(n * d);
          std::copy(x.begin(), x.end(), buf.data.begin());
          Tensor xt(buf.ptr(), DType::kF32, {n, d});
          GuardedBuffer out(n * d);
          Tensor ot = alias ? xt : Tensor(out.ptr(), DType::kF32, {n, d});
          be->rms_norm(xt, Tensor(w.data(), DType::kF32, {d}), eps, ot);
          ASSERT_TRUE(buf.guard_intact() && out.guard_intact()) << ctx;
          const float* got = alias ? buf.ptr() : out.ptr();
          for (int64_t i = 0; i < n * d; ++i, ++checked) {
            PAGELLM_EXPECT_CLOSE(got[i], want[i], kNormTol, ctx, i);
          }
          if (HasFailure()) return;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Bit-exact with the f32 formula Hugging Face evaluates: variance in f32, x * rsqrt(var + eps),
// then * w; the reference computes the sum in double, so compare through the same float steps.
TEST(CpuOps, RmsNormFollowsHuggingFaceOrder) {
  auto ref = make_cpu_backend(false);
  const int64_t d = 8;
  std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f, 0.25f, -1.0f, 2.0f, 4.0f};
  std::vector<float> w = {1.0f, 0.5f, 2.0f, 1.0f, 1.5f, 1.0f, 0.75f, 1.25f};
  std::vector<float> out(d);
  Tensor ot(out.data(), DType::kF32, {1, d});
  ref->rms_norm(Tensor(x.data(), DType::kF32, {1, d}), Tensor(w.data(), DType::kF32, {d}), 1e-5f, ot);
  float ss = 0;  // exact in f32 for these values
  for (float v : x) ss += v * v;
  const float inv = 1.0f / std::sqrt(ss / d + 1e-5f);
  int64_t checked = 0;
  for (int64_t k = 0; k < d; ++k, ++checked) EXPECT_EQ(out[k], (x[k] * inv) * w[k]) << k;
  EXPECT_GT(checked, 0);
}

TEST(CpuOps, AddRmsNormUpdatesResidual) {
  int64_t checked = 0;
  uint32_t seed = 800;
  for (auto& [isa, be] : all_backends()) {
    for (int64_t n : {1, 7, 19}) {
      for (int64_t d : {64, 100, 2048}) {
        const std::string ctx = isa + " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                " seed=" + std::to_string(++seed);
        std::mt19937 rng(seed);
        std::vector<float> x = random_floats(rng, n * d), res = random_floats(rng, n * d);
        std::vector<float> w = random_floats(rng, d, 0.5f, 1.5f);
        std::vector<float> sum(n * d);
        for (int64_t i = 0; i < n * d; ++i) sum[i] = res[i] + x[i];  // exact expected residual
        const std::vector<double> want = naive_rms_norm(sum, w, n, d, 1e-5f);
        GuardedBuffer xb(n * d), rb(n * d);
        std::copy(x.begin(), x.end(), xb.data.begin());
        std::copy(res.begin(), res.end(), rb.data.begin());
        Tensor xt(xb.ptr(), DType::kF32, {n, d}), rt(rb.ptr(), DType::kF32, {n, d});
        be->add_rms_norm(xt, rt, Tensor(w.data(), DType::kF32, {d}), 1e-5f, xt);  // out aliases x
        ASSERT_TRUE(xb.guard_intact() && rb.guard_intact()) << ctx;
        for (int64_t i = 0; i < n * d; ++i, checked += 2) {
          ASSERT_EQ(rb.data[i], sum[i]) << ctx << " residual " << i;
          PAGELLM_EXPECT_CLOSE(xb.data[i], want[i], kNormTol, ctx, i);
        }
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuOps, SiluMulOnColumnSlices) {
  int64_t checked = 0;
  uint32_t seed = 900;
  for (auto& [isa, be] : all_backends()) {
    for (int64_t n : {1, 7, 19}) {
      for (int64_t f : {16, 37, 1024}) {
        const std::string ctx = isa + " n=" + std::to_string(n) + " F=" + std::to_string(f) +
                                " seed=" + std::to_string(++seed);
        std::mt19937 rng(seed);
        // gate and up are the two halves of one [n, 2F] buffer (a fused gate_up projection);
        // values to +-20 reach both tails of the sigmoid.
        std::vector<float> gu = random_floats(rng, n * 2 * f, -20.0f, 20.0f);
        Tensor gut(gu.data(), DType::kF32, {n, 2 * f});
        GuardedBuffer out(n * f);
        Tensor ot(out.ptr(), DType::kF32, {n, f});
        be->silu_mul(gut.slice_cols(0, f), gut.slice_cols(f, 2 * f), ot);
        ASSERT_TRUE(out.guard_intact()) << ctx;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < f; ++k, ++checked) {
            const double g = gu[i * 2 * f + k], u = gu[i * 2 * f + f + k];
            const double want = g / (1.0 + std::exp(-g)) * u;
            // f32 exp and division: relative error a few ulp (1e-6 of the magnitude).
            PAGELLM_EXPECT_CLOSE(out.data[i * f + k], want, 1e-6 * std::fabs(want) + 1e-7, ctx,
                                 i * f + k);
          }
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuOps, AddGatherToF32) {
  int64_t checked = 0;
  uint32_t seed = 1000;
  for (auto& [isa, be] : all_backends()) {
    const std::string ctx = isa + " seed=" + std::to_string(++seed);
    std::mt19937 rng(seed);
    const int64_t n = 19, d = 37;
    std::vector<float> a = random_floats(rng, n * d), b = random_floats(rng, n * d);
    GuardedBuffer sum(n * d);
    Tensor st(sum.ptr(), DType::kF32, {n, d});
    be->add(Tensor(a.data(), DType::kF32, {n, d}), Tensor(b.data(), DType::kF32, {n, d}), st);
    ASSERT_TRUE(sum.guard_intact()) << ctx;
    for (int64_t i = 0; i < n * d; ++i, ++checked) ASSERT_EQ(sum.data[i], a[i] + b[i]) << ctx << i;

    std::vector<int32_t> rows = {18, 0, 5, 5};
    GuardedBuffer g(4 * d);
    Tensor gt(g.ptr(), DType::kF32, {4, d});
    be->gather_rows(Tensor(a.data(), DType::kF32, {n, d}), Tensor(rows.data(), DType::kI32, {4}), gt);
    ASSERT_TRUE(g.guard_intact()) << ctx;
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t k = 0; k < d; ++k, ++checked) ASSERT_EQ(g.data[i * d + k], a[rows[i] * d + k]);

    GuardedBuffer f(n * d);
    Tensor ft(f.ptr(), DType::kF32, {n, d});
    be->to_f32(Tensor(b.data(), DType::kF32, {n, d}), ft);
    ASSERT_TRUE(f.guard_intact()) << ctx;
    for (int64_t i = 0; i < n * d; ++i, ++checked) ASSERT_EQ(f.data[i], b[i]) << ctx << i;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuOps, EmbeddingEveryTableDtype) {
  int64_t checked = 0;
  uint32_t seed = 1100;
  for (auto& [isa, be] : all_backends()) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      const std::string ctx = isa + " " + std::string(dtype_name(t)) + " seed=" + std::to_string(++seed);
      std::mt19937 rng(seed);
      const int64_t vocab = 50, d = 64;
      std::vector<float> tf = random_floats(rng, vocab * d);
      std::vector<uint8_t> table(dtype_bytes(t, vocab * d));
      from_f32(t, tf.data(), table.data(), vocab * d);
      std::vector<float> deq(vocab * d);
      pagellm::to_f32(t, table.data(), deq.data(), vocab * d);
      std::vector<int32_t> ids = {49, 0, 7, 7, 23};
      GuardedBuffer out(ids.size() * d);
      Tensor ot(out.ptr(), DType::kF32, {int64_t(ids.size()), d});
      be->embedding(Tensor(table.data(), t, {vocab, d}), Tensor(ids.data(), DType::kI32, {5}), ot);
      ASSERT_TRUE(out.guard_intact()) << ctx;
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t k = 0; k < d; ++k, ++checked)
          ASSERT_EQ(out.data[i * d + k], deq[ids[i] * d + k]) << ctx << " row " << i;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMemory, AllocateAlignedAndFreeMemory) {
  auto be = make_cpu_backend();
  for (int64_t bytes : {0, 1, 63, 64, 1000, 1 << 20}) {
    auto buf = be->allocate(bytes);
    ASSERT_NE(buf, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 64, 0u) << bytes;
    EXPECT_EQ(buf->nbytes(), bytes);
    EXPECT_EQ(buf->device(), Device::kCpu);
  }
  auto buf = be->allocate(4 * 12);
  Tensor t = buf->view(DType::kF32, {3, 4});
  EXPECT_EQ(t.data, buf->data());
  EXPECT_GT(be->free_memory(), 0);
  EXPECT_EQ(be->activation_dtype(), DType::kF32);
  EXPECT_EQ(be->device(), Device::kCpu);
}

TEST(CpuMemory, UploadWeight) {
  auto be = make_cpu_backend();
  std::mt19937 rng(1200);
  const int64_t m = 3, k = 64;
  std::vector<float> wf = random_floats(rng, m * k);
  std::vector<uint16_t> wb(m * k);
  from_f32(DType::kBF16, wf.data(), wb.data(), m * k);
  Tensor bf(wb.data(), DType::kBF16, {m, k});
  int64_t checked = 0;

  std::unique_ptr<Buffer> storage;
  auto same = be->upload_weight(bf, DType::kBF16, storage);
  ASSERT_TRUE(same.ok()) << same.status().to_string();
  EXPECT_EQ(same->data, bf.data) << "same dtype must be a zero-copy view";
  EXPECT_EQ(storage, nullptr);

  auto f32 = be->upload_weight(bf, DType::kF32, storage);  // e.g. norm weights
  ASSERT_TRUE(f32.ok()) << f32.status().to_string();
  ASSERT_NE(storage, nullptr);
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(f32->data, storage->data());
  for (int64_t i = 0; i < m * k; ++i, ++checked)
    ASSERT_EQ(f32->ptr<float>()[i], bf16_to_f32(wb[i])) << i;

  std::unique_ptr<Buffer> qstorage;
  auto q8 = be->upload_weight(bf, DType::kQ8_0, qstorage);
  ASSERT_TRUE(q8.ok()) << q8.status().to_string();
  std::vector<uint8_t> want(dtype_bytes(DType::kQ8_0, m * k));
  std::vector<float> wbf(m * k);
  pagellm::to_f32(DType::kBF16, wb.data(), wbf.data(), m * k);
  from_f32(DType::kQ8_0, wbf.data(), want.data(), m * k);
  EXPECT_EQ(std::memcmp(q8->data, want.data(), want.size()), 0);
  ++checked;

  // Quantized stays quantized; converting it to another quantized type is refused.
  std::unique_ptr<Buffer> s2;
  auto q8same = be->upload_weight(*q8, DType::kQ8_0, s2);
  ASSERT_TRUE(q8same.ok());
  EXPECT_EQ(q8same->data, q8->data);
  auto requant = be->upload_weight(*q8, DType::kQ4_0, s2);
  EXPECT_FALSE(requant.ok());
  EXPECT_EQ(requant.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(requant.status().message().find("q8_0"), std::string::npos);

  // A vector of odd length cannot be quantized; integers cannot be converted.
  std::vector<float> v(10, 1.0f);
  auto bad = be->upload_weight(Tensor(v.data(), DType::kF32, {10}), DType::kQ4_0, s2);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> ints(4);
  auto bad2 = be->upload_weight(Tensor(ints.data(), DType::kI32, {4}), DType::kF32, s2);
  EXPECT_EQ(bad2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace pagellm::testing
