// The transformer block's fused projections against the CPU reference (which runs their steps
// apart): matmul_add (residual += x . w^T + bias), matmul_swiglu, rms_norm_matmul and
// rms_norm_swiglu. On the GPU decode-sized batches take the GEMV with the add in its epilogue,
// SwiGLU from each warp's gate and up rows, and, when PAGELLM_GEMV_FUSIONS folds the norm weights
// into the projections (scripts/gpu-check.sh runs this file both ways), the norm with a weight of
// ones taken in a pass over x; larger ones cuBLASLt with beta = 1 and the norm and SwiGLU kernels
// around the product. Every GEMV fusion is also launched directly for each batch size 1..8 on odd
// shapes, and for each split of K among a row group's warps.
//
// Tolerance. The output is rounded to bf16 once (kBf16Tol). The GPU may also round the normalized
// rows h (the unfused path) and the gate/up products (unfused SwiGLU) to bf16 where the reference
// keeps f32: a rounding of h moves an output by about 2^-9 of sqrt(sum_k (h_k w_mk)^2), whatever
// the output's own size, so each output gets that much slack (2^-6 of it: 14x the rounding's
// standard deviation, while a wrong norm scale or a missed row is off by whole units). SwiGLU
// carries those errors of gate and up, and the bf16 rounding of each, through silu(g) * u.
// matmul_add reads x exactly as the reference does; a bias added after the rounding of the sum
// gets slack (as in matmul), and so does the product: cuBLASLt may round it to bf16 before adding
// the residual (the H100 does for 19 x 4096 x 4096, algorithm 66 without split-K: outputs up to
// 0.007 off on the 2^-7 grid of their ~1-2 sized products), the rounding transformers' own
// o_proj + residual makes. Half an ulp of the product, 2^-8 of it, where a wrong row is whole units.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "op_test_util.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_views.h"

namespace pagellm::optest {
namespace {

enum class Fused { kMatmulAdd, kMatmulSwiGlu, kNormMatmul, kNormSwiGlu };

const char* name_of(Fused f) {
  switch (f) {
    case Fused::kMatmulAdd:
      return "matmul_add";
    case Fused::kMatmulSwiGlu:
      return "matmul_swiglu";
    case Fused::kNormMatmul:
      return "rms_norm_matmul";
    case Fused::kNormSwiGlu:
      return "rms_norm_swiglu";
  }
  return "?";
}

struct FusedCase {
  Fused op;
  int64_t n, k, m;  // m: out columns (SwiGLU: F, with 2F weight rows)
  bool bias = false;
  bool direct_gemv = false;  // launch the GEMV kernel itself, whatever the backend would choose
  int k_split = 0;           // direct_gemv: warps per row group (0: gemv.cu's rule)
  // The norm weight is ones (the reference's too): what the direct GEMV's norm takes
  // (GemvFusion::unit_norm, a weight folded into w).
  bool unit_norm = false;
  bool folded = false;  // backend path: the norm weight goes through fold_norm_weight first
};

void run_case(Backend& cuda, Backend& cpu, uint64_t seed, const FusedCase& c) {
  Rng rng(seed);
  const bool swiglu = c.op == Fused::kNormSwiGlu || c.op == Fused::kMatmulSwiGlu;
  const bool norm = c.op == Fused::kNormMatmul || c.op == Fused::kNormSwiGlu;
  const int64_t wrows = swiglu ? 2 * c.m : c.m;
  // x: the residual stream (amplitude 4, so the norm matters) or the activation of matmul_add.
  std::vector<float> xv = random_bf16_values(rng, c.n * c.k, norm ? 4.0f : 1.0f);
  std::vector<float> wv = random_bf16_values(rng, wrows * c.k);
  std::vector<float> bias = random_bf16_values(rng, wrows, 0.5f);
  std::vector<float> gv(c.k);
  for (auto& g : gv) g = c.unit_norm ? 1.0f : rng.uniform(0.5f, 1.5f);
  std::vector<float> resid = random_bf16_values(rng, c.n * c.m, 2.0f);

  auto x_dev = upload_bf16(cuda, xv);
  Tensor x_t = x_dev->view(DType::kBF16, {c.n, c.k});
  std::vector<uint16_t> w_bits = to_bf16_bits(wv);
  Tensor w_host(w_bits.data(), DType::kBF16, {wrows, c.k});
  std::unique_ptr<Buffer> w_storage, b_storage, g_storage;
  auto w_dev = cuda.upload_weight(w_host, DType::kBF16, w_storage);
  ASSERT_TRUE(w_dev.ok()) << w_dev.status().to_string();
  auto g_dev = cuda.upload_weight(host_f32(gv, {c.k}), DType::kF32, g_storage);
  ASSERT_TRUE(g_dev.ok());
  Tensor w_t = *w_dev, g_t = *g_dev;
  if (c.folded) g_t = cuda.fold_norm_weight(*g_dev, w_t);  // scales w_t's columns, or not
  Tensor b_dev;
  if (c.bias) {
    auto b = cuda.upload_weight(host_f32(bias, {wrows}), DType::kF32, b_storage);
    ASSERT_TRUE(b.ok());
    b_dev = *b;
  }
  // out starts as the residual for matmul_add, as the 0xA5 sentinel otherwise.
  std::unique_ptr<DevBuf> out = c.op == Fused::kMatmulAdd
                                    ? upload_bf16(cuda, resid)
                                    : std::make_unique<DevBuf>(cuda, c.n * c.m * 2);
  Tensor out_t = out->view(DType::kBF16, {c.n, c.m});
  DevBuf h(cuda, c.n * c.k * 2), scratch(cuda, c.n * wrows * 2);
  Tensor h_t = h.view(DType::kBF16, {c.n, c.k}), s_t = scratch.view(DType::kBF16, {c.n, wrows});

  if (c.direct_gemv) {
    auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
    ASSERT_NE(cb, nullptr);
    cuda::GemvFusion f;
    if (norm) {
      ASSERT_TRUE(c.unit_norm) << "the GEMV's norm takes a weight of ones only";
      f.eps = 1e-5f;
      f.unit_norm = true;
    }
    f.epilogue = swiglu                      ? cuda::GemvEpilogue::kSwiGlu
                 : c.op == Fused::kMatmulAdd ? cuda::GemvEpilogue::kAdd
                                             : cuda::GemvEpilogue::kStore;
    f.k_split = c.k_split;
    ASSERT_TRUE(cuda::gemv_fusion_supported(cuda::rows_of(x_t), cuda::rows_of(w_t),
                                            cuda::rows_of(out_t), f));
    cuda::launch_gemv(cuda::rows_of(x_t), cuda::rows_of(w_t), b_dev.data, DType::kF32,
                      cuda::rows_of(out_t), cb->stream(), f);
  } else if (c.op == Fused::kMatmulAdd) {
    Tensor s_m = s_t.slice_cols(0, c.m);
    cuda.matmul_add(x_t, w_t, b_dev, s_m, out_t);
  } else if (c.op == Fused::kMatmulSwiGlu) {
    cuda.matmul_swiglu(x_t, w_t, b_dev, s_t, out_t);
  } else if (c.op == Fused::kNormMatmul) {
    cuda.rms_norm_matmul(x_t, g_t, 1e-5f, w_t, b_dev, h_t, out_t);
  } else {
    cuda.rms_norm_swiglu(x_t, g_t, 1e-5f, w_t, b_dev, h_t, s_t, out_t);
  }

  // The reference: the CPU backend's composition of the steps, in f32.
  std::vector<float> want = c.op == Fused::kMatmulAdd ? resid : std::vector<float>(c.n * c.m);
  std::vector<float> h_ref(c.n * c.k), y_ref(c.n * wrows), x_ref = xv, g_ref = gv;
  Tensor want_t = host_f32(want, {c.n, c.m}), h_rt = host_f32(h_ref, {c.n, c.k});
  Tensor y_rt = host_f32(y_ref, {c.n, wrows}), x_rt = host_f32(x_ref, {c.n, c.k});
  Tensor g_rt = host_f32(g_ref, {c.k});
  Tensor bias_h = c.bias ? host_f32(bias, {wrows}) : Tensor();
  if (c.op == Fused::kMatmulAdd) {
    Tensor y_m = y_rt.slice_cols(0, c.m);
    cpu.matmul_add(x_rt, w_host, bias_h, y_m, want_t);
  } else if (c.op == Fused::kMatmulSwiGlu) {
    cpu.matmul_swiglu(x_rt, w_host, bias_h, y_rt, want_t);
  } else if (c.op == Fused::kNormMatmul) {
    cpu.rms_norm_matmul(x_rt, g_rt, 1e-5f, w_host, bias_h, h_rt, want_t);
  } else {
    cpu.rms_norm_swiglu(x_rt, g_rt, 1e-5f, w_host, bias_h, h_rt, y_rt, want_t);
  }

  // Slack per output (see the top of the file). The reference left h (the normalized rows) and,
  // for SwiGLU, y = [gate | up] in its scratch.
  std::vector<float> slack(c.n * c.m, 0.0f);
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t col = 0; col < c.m; ++col) {
      double spread[2] = {0.0, 0.0};  // sqrt(sum_k (h_k w_rk)^2) of the output's weight rows
      for (int r = 0; r < (swiglu ? 2 : 1); ++r) {
        const float* wr = wv.data() + (col + r * c.m) * c.k;
        const float* hr = norm ? h_ref.data() + i * c.k : xv.data() + i * c.k;
        double s = 0.0;
        for (int64_t k = 0; k < c.k; ++k) s += static_cast<double>(hr[k]) * wr[k] * hr[k] * wr[k];
        spread[r] = std::sqrt(s);
      }
      // matmul_add reads x as both sides have it; its bias may be added after a rounding, and its
      // product rounded before the residual is added.
      double e = norm ? std::ldexp(spread[0], -6) : 0.0;
      if (c.bias && !norm) e += std::ldexp(std::fabs(want[i * c.m + col] - bias[col]), -8);
      if (c.op == Fused::kMatmulAdd)
        e += std::ldexp(std::fabs(want[i * c.m + col] - resid[i * c.m + col]), -8);
      if (swiglu) {
        const double g = y_ref[i * wrows + col], u = y_ref[i * wrows + c.m + col];
        const double sg = 1.0 / (1.0 + std::exp(-g));
        const double dsilu = sg * (1.0 + g * (1.0 - sg));  // d/dg of g * sigmoid(g)
        // Each of gate and up: its own rounding, the rounding of h, and that of the product
        // before a bias added by its own kernel.
        const double bg = c.bias ? bias[col] : 0.0, bu = c.bias ? bias[c.m + col] : 0.0;
        const double eg = std::ldexp(std::fabs(g) + std::fabs(g - bg), -8) +
                          (norm ? std::ldexp(spread[0], -6) : 0.0);
        const double eu = std::ldexp(std::fabs(u) + std::fabs(u - bu), -8) +
                          (norm ? std::ldexp(spread[1], -6) : 0.0);
        e = std::fabs(dsilu * u) * eg + std::fabs(g * sg) * eu;
      }
      slack[i * c.m + col] = static_cast<float>(e);
    }
  }
  const std::string what = Label(name_of(c.op), seed)("n", c.n)("k", c.k)("m", c.m)("bias", c.bias)(
      "path", c.direct_gemv ? "gemv" : "backend")("k_split", c.k_split)("unit_norm", c.unit_norm)(
      "folded", c.folded);
  EXPECT_TRUE(guards_ok(what, *out));
  EXPECT_TRUE(compare(what, download_bf16(*out), want, kBf16Tol, &slack));
}

// Through the backend: decode sizes (the fused GEMV where the plain product would be a GEMV) and
// prefill sizes (cuBLASLt's beta = 1, the norm and SwiGLU kernels), odd shapes and the
// Llama-3-8B projections (q|k|v 6144 x 4096, o_proj 4096 x 4096, gate|up 2 x 14336 x 4096, down
// 4096 x 14336).
TEST(FusedProjection, BackendOddAndLlamaShapes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9000;
  int cases = 0;
  for (Fused op :
       {Fused::kMatmulAdd, Fused::kMatmulSwiGlu, Fused::kNormMatmul, Fused::kNormSwiGlu}) {
    for (int64_t n : {1, 2, 7, 19, 111}) {
      run_case(cuda, cpu, ++seed, {op, n, 264, 111, n % 2 == 1});
      run_case(cuda, cpu, ++seed, {op, n, 72, 1031, n % 2 == 0});
      cases += 2;
    }
  }
  for (int64_t n : {1, 2, 19}) {
    run_case(cuda, cpu, ++seed, {Fused::kNormMatmul, n, 4096, 6144});
    run_case(cuda, cpu, ++seed, {Fused::kMatmulAdd, n, 4096, 4096});
    run_case(cuda, cpu, ++seed, {Fused::kNormSwiGlu, n, 4096, 14336});
    run_case(cuda, cpu, ++seed, {Fused::kMatmulAdd, n, 14336, 4096});
    cases += 4;
  }
  run_case(cuda, cpu, ++seed, {Fused::kMatmulSwiGlu, 1, 2048, 1408});  // DeepSeek-V2-Lite shared
  EXPECT_EQ(cases + 1, 53);
}

bool has_norm(Fused op) {
  return op == Fused::kNormMatmul || op == Fused::kNormSwiGlu;
}

// Every GEMV fusion for every batch size the GEMV takes, launched directly: K of one 8-element
// piece up to a partial unrolled stretch, out widths with a half-empty last warp.
TEST(FusedProjection, GemvEveryBatchSize) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9500;
  int cases = 0;
  for (Fused op :
       {Fused::kMatmulAdd, Fused::kMatmulSwiGlu, Fused::kNormMatmul, Fused::kNormSwiGlu}) {
    for (int64_t n = 1; n <= 8; ++n) {
      for (auto [k, m] : {std::pair<int64_t, int64_t>{8, 3}, {264, 111}, {4104, 1031}}) {
        FusedCase c{op, n, k, m, (n + k) % 2 == 0, true};
        c.unit_norm = has_norm(op);
        run_case(cuda, cpu, ++seed, c);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 96);
}

// Every way of splitting K among a row group's warps, each fusion: K shorter than one piece per
// warp, K ending mid-piece, and 1025 rows, whose last block holds groups past the last row (they
// still meet the others at the barrier where the partial sums are added).
TEST(FusedProjection, GemvKSplits) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9800;
  int cases = 0;
  for (Fused op :
       {Fused::kMatmulAdd, Fused::kMatmulSwiGlu, Fused::kNormMatmul, Fused::kNormSwiGlu}) {
    for (int split : {1, 2, 4, 8}) {
      for (int64_t n : {1, 5}) {
        for (auto [k, m] : {std::pair<int64_t, int64_t>{264, 111}, {4104, 1025}}) {
          FusedCase c{op, n, k, m, n == 5, true, split};
          c.unit_norm = has_norm(op);
          run_case(cuda, cpu, ++seed, c);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 64);
}

// The norm weight through Backend::fold_norm_weight, then the backend's pre-norm projections
// with the weight it hands back, against the reference with the original weight: decode sizes
// (the GEMV's unit norm when the fold is on) and a prefill size (the norm kernel with a weight of
// ones, then cuBLASLt over the folded w), odd and Llama-3-8B shapes. With the fold off (the
// default) the backend hands g back unchanged, and this is the plain path.
TEST(FusedProjection, FoldedNormWeight) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9950;
  int cases = 0;
  for (Fused op : {Fused::kNormMatmul, Fused::kNormSwiGlu}) {
    for (int64_t n : {1, 7, 19}) {
      for (auto [k, m] : {std::pair<int64_t, int64_t>{264, 111},
                          {4096, op == Fused::kNormMatmul ? 6144 : 14336}}) {
        FusedCase c{op, n, k, m, n == 7};
        c.folded = true;
        run_case(cuda, cpu, ++seed, c);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 12);
}

// The fold's column scaling on a strided view: every element of the view scaled by its column's
// factor and rounded once, the row padding past it untouched.
TEST(ScaleColumns, MatchesHost) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;  // the reference is computed here on the host
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
  ASSERT_NE(cb, nullptr);
  uint64_t seed = base_seed() + 9990;
  for (auto [rows, cols, ld] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                                {7, 19, 24},
                                {111, 264, 264},
                                {1031, 4096, 4104}}) {
    Rng rng(++seed);
    std::vector<float> wv = random_bf16_values(rng, rows * ld, 2.0f), gv(cols);
    for (auto& g : gv) g = rng.uniform(0.5f, 1.5f);
    auto w = upload_bf16(cuda, wv);
    auto g_dev = upload_raw(cuda, gv);
    cuda::launch_scale_columns(cuda::RowView{w->data(), DType::kBF16, rows, cols, ld},
                               static_cast<const float*>(g_dev->data()), cb->stream());
    std::vector<float> want = wv;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[r * ld + c] = bf16_to_f32(f32_to_bf16(wv[r * ld + c] * gv[c]));
    const std::string what = Label("scale_columns", seed)("rows", rows)("cols", cols)("ld", ld);
    EXPECT_TRUE(guards_ok(what, *w));
    // One product of two values rounded once to nearest even, on both sides.
    EXPECT_TRUE(compare(what, download_bf16(*w), want, kExact));
  }
}

}  // namespace
}  // namespace pagellm::optest
