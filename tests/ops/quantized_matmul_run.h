// The device half of the quantized-weight matmul tests (int4_matmul_test, fp8_matmul_test): the
// operands a case draws after its weights, the product on the device, its output back.
#pragma once

#include <cmath>

#include "op_test_util.h"

namespace pagellm::optest {

struct QuantizedMatmulCase {
  int64_t n, k, m;
  DType out = DType::kBF16;
  bool bias = false;
  bool add = false;  // matmul_add onto random values
};

struct QuantizedMatmulRun {
  std::vector<float> x, bias, start, got;  // bias drawn either way; start zeros without add
};

// Draws the bias, x and (add) the output's start values from rng, in that order, runs
// out (+)= x . w^T + bias on the device with the uploaded weight w_dev, and checks the output
// buffer's guard bytes.
inline QuantizedMatmulRun run_quantized_matmul(Backend& cuda, Rng& rng, const Tensor& w_dev,
                                               const QuantizedMatmulCase& c,
                                               const std::string& what) {
  QuantizedMatmulRun r;
  r.bias = random_bf16_values(rng, c.m, 4.0f);
  std::unique_ptr<Buffer> b_storage;
  Tensor b_dev;
  if (c.bias) {
    auto b = cuda.upload_weight(host_f32(r.bias, {c.m}), DType::kF32, b_storage);
    EXPECT_TRUE(b.ok());
    if (b.ok()) b_dev = *b;
  }
  r.x = random_bf16_values(rng, c.n * c.k);
  auto x_dev = upload_bf16(cuda, r.x);
  const int64_t esz = c.out == DType::kF32 ? 4 : 2;
  DevBuf out(cuda, c.n * c.m * esz);
  r.start.assign(c.n * c.m, 0.0f);
  if (c.add) {
    r.start = random_bf16_values(rng, c.n * c.m, 4.0f);
    if (esz == 4) {
      out.upload(r.start.data(), c.n * c.m * 4);
    } else {
      const auto bits = to_bf16_bits(r.start);
      out.upload(bits.data(), c.n * c.m * 2);
    }
  }
  Tensor x_t = x_dev->view(DType::kBF16, {c.n, c.k});
  Tensor out_t = out.view(c.out, {c.n, c.m});
  DevBuf scratch(cuda, c.n * c.m * esz);
  Tensor scratch_t = scratch.view(c.out, {c.n, c.m});
  if (c.add) {
    cuda.matmul_add(x_t, w_dev, b_dev, scratch_t, out_t);
  } else {
    cuda.matmul(x_t, w_dev, b_dev, out_t);
  }
  r.got = esz == 4 ? out.download<float>() : download_bf16(out);
  r.got.resize(c.n * c.m);
  EXPECT_TRUE(guards_ok(what, out));
  return r;
}

// The slack of a product whose weights reach cuBLASLt rounded to bf16 (dequantized slices):
// 2^-9 relative each, with random signs, so an output may move by that many standard deviations
// of the sum of its terms' rounding, sqrt(sum (x w)^2) 2^-9 / sqrt(3); 4 of 2^-9 is 6.9 of them.
// The bias and the added values are rounded once more apart in cuBLASLt's epilogue-less paths:
// half an ulp of the product, as matmul_test allows. x [n, k] and w [m, k] as f32 values.
inline float sliced_gemm_slack(const float* x, const float* w, int64_t k) {
  double ss = 0.0, dot = 0.0;
  for (int64_t l = 0; l < k; ++l) {
    const double t = static_cast<double>(x[l]) * w[l];
    ss += t * t;
    dot += t;
  }
  return static_cast<float>(4.0 * std::ldexp(std::sqrt(ss), -9) + std::ldexp(std::fabs(dot), -8));
}

}  // namespace pagellm::optest
