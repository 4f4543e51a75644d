// matmul: the reference against a naive double-precision product of dequantized weights, and every
// fast ISA path (GEMV for n <= 8, blocked GEMM above) against the reference, for every weight
// dtype, with bias, strided activation and output rows, and guard values around the output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/kquants.h"
#include "cpu_test_util.h"

namespace pagellm::testing {
namespace {

// Weights of the types pagellm only reads (GGUF's 5-bit and k-quants: llama.cpp quantizes them):
// random bytes with every block's f16 (Q8_K: f32) scales set to small finite values.
void random_blocks(DType t, std::mt19937& rng, std::vector<uint8_t>& bytes) {
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  auto h = [&] { return f32_to_f16(scale(rng)); };
  for (size_t off = 0; off < bytes.size(); off += block_bytes(t)) {
    void* b = bytes.data() + off;
    switch (t) {
      case DType::kQ5_0:
        static_cast<BlockQ5_0*>(b)->d = h();
        break;
      case DType::kQ5_1:
        static_cast<BlockQ5_1*>(b)->d = h(), static_cast<BlockQ5_1*>(b)->m = h();
        break;
      case DType::kQ2_K:
        static_cast<BlockQ2_K*>(b)->d = h(), static_cast<BlockQ2_K*>(b)->dmin = h();
        break;
      case DType::kQ3_K:
        static_cast<BlockQ3_K*>(b)->d = h();
        break;
      case DType::kQ4_K:
        static_cast<BlockQ4_K*>(b)->d = h(), static_cast<BlockQ4_K*>(b)->dmin = h();
        break;
      case DType::kQ5_K:
        static_cast<BlockQ5_K*>(b)->d = h(), static_cast<BlockQ5_K*>(b)->dmin = h();
        break;
      case DType::kQ6_K:
        static_cast<BlockQ6_K*>(b)->d = h();
        break;
      case DType::kQ8_K: {
        const float d = scale(rng);
        std::memcpy(&static_cast<BlockQ8_K*>(b)->d, &d, 4);
        break;
      }
      default:
        FAIL() << "random_blocks: " << dtype_name(t);
    }
  }
}

struct MatmulCase {
  DType dtype;
  int64_t n, k, m;
  bool bias, strided;
};

std::string describe(const MatmulCase& c, uint32_t seed) {
  return std::string(dtype_name(c.dtype)) + " n=" + std::to_string(c.n) + " K=" +
         std::to_string(c.k) + " M=" + std::to_string(c.m) + (c.bias ? " bias" : "") +
         (c.strided ? " strided" : "") + " seed=" + std::to_string(seed);
}

std::vector<MatmulCase> cases() {
  std::vector<MatmulCase> out;
  const DType all[] = {DType::kF32,  DType::kF16,   DType::kBF16,  DType::kQ8_0,   DType::kQ4_0,
                       DType::kQ4_1, DType::kI4G32, DType::kI4G64, DType::kI4G128, DType::kQ5_0,
                       DType::kQ5_1, DType::kQ2_K,  DType::kQ3_K,  DType::kQ4_K,   DType::kQ5_K,
                       DType::kQ6_K, DType::kQ8_K, DType::kF8B32};
  int variant = 0;
  for (DType t : all) {
    // Row lengths a whole number of blocks: 128-value groups take multiples of 128, k-quants of
    // 256 (their K = 1280 GEMM ends on a half slice).
    const int64_t e = block_elems(t);
    const bool wide = e > 32;
    for (int64_t n : {1, 2, 7, 19, 111}) {
      for (auto [k, m] :
           {std::pair<int64_t, int64_t>{wide ? e : 96, 224}, {wide ? 3 * e : 224, 96}}) {
        ++variant;
        out.push_back({t, n, k, m, variant % 2 == 0, variant % 3 == 0});
      }
    }
    // K spans several 512-wide GEMM slices, M leaves a partial panel, n two row blocks; and
    // every GEMV row count up to 8 with a non-power-of-two M.
    const int64_t big = e == 256 ? 1280 : wide ? 1152 : 1056;
    out.push_back({t, 300, big, 130, true, true});
    out.push_back({t, 3, big, 130, false, true});
    for (int64_t n = 3; n <= 8; ++n)
      out.push_back({t, n, wide ? 256 : 160, 37, n % 2 == 1, n % 2 == 0});
    // Plain types take any K: exercise the scalar tails.
    if (!is_quantized(t)) {
      out.push_back({t, 5, 45, 19, true, false});
      out.push_back({t, 23, 45, 19, false, true});
    }
  }
  return out;
}

// Everything one case needs, built from a seed.
struct MatmulData {
  std::vector<uint8_t> w_bytes;
  std::vector<float> w_deq;  // [M, K] the dequantized weights (what every path must multiply)
  std::vector<float> x;      // [n, ldx]
  std::vector<float> bias;
  int64_t ldx, ldo, out_offset;
  Tensor w, xt, bt;

  MatmulData(const MatmulCase& c, uint32_t seed) {
    std::mt19937 rng(seed);
    const std::vector<float> wf = random_floats(rng, c.m * c.k);
    w_bytes.resize(dtype_bytes(c.dtype, c.m * c.k));
    if (c.dtype == DType::kQ5_0 || c.dtype == DType::kQ5_1 || is_kquant(c.dtype)) {
      random_blocks(c.dtype, rng, w_bytes);
    } else {
      from_f32(c.dtype, wf.data(), w_bytes.data(), c.m * c.k);
    }
    w_deq.resize(c.m * c.k);
    pagellm::to_f32(c.dtype, w_bytes.data(), w_deq.data(), c.m * c.k);
    ldx = c.strided ? c.k + 13 : c.k;  // strided: x rows are a slice of a wider buffer
    x = random_floats(rng, c.n * ldx, -2.0f, 2.0f);
    bias = random_floats(rng, c.m);
    ldo = c.strided ? c.m + 7 : c.m;
    out_offset = c.strided ? 3 : 0;
    w = Tensor(w_bytes.data(), c.dtype, {c.m, c.k});
    xt = Tensor(x.data(), DType::kF32, {c.n, ldx}).slice_cols(0, c.k);
    if (c.bias) bt = Tensor(bias.data(), DType::kF32, {c.m});
  }

  // Runs the backend into a fresh guarded buffer; returns [n * ldo] values (gap columns included).
  GuardedBuffer run(Backend& be, const MatmulCase& c) {
    GuardedBuffer out(c.n * ldo);
    Tensor ot = Tensor(out.ptr(), DType::kF32, {c.n, ldo}).slice_cols(out_offset, out_offset + c.m);
    be.matmul(xt, w, bt, ot);
    return out;
  }
};

// Tolerance: both sides sum K f32 products in some order; rounding error grows like
// sqrt(K) * eps * sum|x w| for random data (8x headroom), far below any indexing mistake, which
// is off by a whole term (~ sum|x w| / K).
double tolerance(int64_t k, double sum_abs) { return 8.0 * std::sqrt(double(k)) * 6e-8 * sum_abs + 1e-6; }

void check_guards(const GuardedBuffer& out, const MatmulData& d, const MatmulCase& c,
                  const std::string& ctx) {
  ASSERT_TRUE(out.guard_intact()) << ctx << ": wrote past the output";
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t j = 0; j < d.ldo; ++j)
      if (j < d.out_offset || j >= d.out_offset + c.m) {
        ASSERT_EQ(out.data[i * d.ldo + j], kSentinel) << ctx << ": wrote gap column " << j;
      }
}

TEST(CpuMatmul, ReferenceMatchesNaiveDouble) {
  auto ref = make_cpu_backend(false);
  int64_t checked = 0;
  uint32_t seed = 1000;
  for (const MatmulCase& c : cases()) {
    ++seed;
    const std::string ctx = describe(c, seed);
    MatmulData d(c, seed);
    GuardedBuffer out = d.run(*ref, c);
    check_guards(out, d, c, ctx);
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t m = 0; m < c.m; ++m) {
        double want = c.bias ? d.bias[m] : 0.0, sum_abs = 0.0;
        for (int64_t k = 0; k < c.k; ++k) {
          const double p = double(d.x[i * d.ldx + k]) * d.w_deq[m * c.k + k];
          want += p;
          sum_abs += std::fabs(p);
        }
        PAGELLM_EXPECT_CLOSE(out.data[i * d.ldo + d.out_offset + m], want,
                             tolerance(c.k, sum_abs), ctx, i * c.m + m);
        ++checked;
      }
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMatmul, FastMatchesReference) {
  auto ref = make_cpu_backend(false);
  auto fast = fast_backends();
  if (fast.empty()) GTEST_SKIP() << "this CPU has no AVX2+FMA+F16C: no fast path to test";
  int64_t checked = 0;
  for (auto& [isa, be] : fast) {
    uint32_t seed = 2000;
    for (const MatmulCase& c : cases()) {
      ++seed;
      const std::string ctx = isa + " " + describe(c, seed);
      MatmulData d(c, seed);
      GuardedBuffer want = d.run(*ref, c);
      GuardedBuffer got = d.run(*be, c);
      check_guards(got, d, c, ctx);
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t m = 0; m < c.m; ++m) {
          double sum_abs = 0.0;
          for (int64_t k = 0; k < c.k; ++k)
            sum_abs += std::fabs(double(d.x[i * d.ldx + k]) * d.w_deq[m * c.k + k]);
          const int64_t o = i * d.ldo + d.out_offset + m;
          PAGELLM_EXPECT_CLOSE(got.data[o], want.data[o], 2 * tolerance(c.k, sum_abs), ctx,
                               i * c.m + m);
          ++checked;
        }
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(checked, 0);
}

// A [n, H, D] activation whose rows are not evenly spaced (a head slice of a wider buffer) goes
// through the fast path's copy; the result must equal the contiguous product.
TEST(CpuMatmul, UnevenlyStridedInput) {
  auto ref = make_cpu_backend(false);
  auto fast = fast_backends();
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  const int64_t n = 5, h = 3, d = 32, hw = 4, m = 40;  // x = buf[:, :3, :] of buf [n, 4, 32]
  std::vector<float> buf = random_floats(rng, n * hw * d);
  Tensor x(buf.data(), DType::kF32, {n, hw, d});
  x.shape[1] = h;  // [n, 3, 32] with stride[0] = 128: rows of the 2-D view are uneven
  std::vector<float> xc(n * h * d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h * d; ++j) xc[i * h * d + j] = buf[i * hw * d + j];
  std::vector<float> wv = random_floats(rng, m * d);
  Tensor w(wv.data(), DType::kF32, {m, d});
  // Viewed as [n*h, d] rows: 15 rows of 32.
  std::vector<float> want(n * h * m), got(n * h * m);
  Tensor xct(xc.data(), DType::kF32, {n * h, d}), wt(want.data(), DType::kF32, {n * h, m});
  ref->matmul(xct, w, Tensor(), wt);
  int64_t checked = 0;
  for (auto& [isa, be] : fast) {
    Tensor gt(got.data(), DType::kF32, {n, h, m});
    be->matmul(x, w, Tensor(), gt);
    for (size_t i = 0; i < got.size(); ++i, ++checked) {
      PAGELLM_EXPECT_CLOSE(got[i], want[i], 1e-5, isa + " seed=77", i);
    }
  }
  if (!fast.empty()) {
    EXPECT_GT(checked, 0);
  }
}

}  // namespace
}  // namespace pagellm::testing
