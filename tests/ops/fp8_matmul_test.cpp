// FP8 weights on the device (fp8_gemm.cu, fp8_matmul.cpp, cuda_quantized.cpp) against the CPU
// reference, which multiplies the same values as F8B32 blocks: the repacked layout decoded back
// bit for bit, every e4m3 code (subnormals, zeros, both signs) through the GEMV exactly, random
// dummy weights equal to the CPU's, weights whose scales change within 128 columns going to bf16,
// and matmul / matmul_add at batch 1, 7, 16, 32 (the FP8 GEMV), 33, 64 and 512 (cuBLASLt's FP8
// GEMM on x quantized per row and 128 columns, which the reference quantizes alike; dequantized
// slices where there are no FP8 tensor cores), odd shapes, bias, bf16 and f32 outputs, and the
// Llama-3-8B projection shapes.
#include <cstring>

#include "op_test_util.h"
#include "quantized_matmul_run.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8_matmul.h"
#include "backend/cuda/kernels.h"

namespace pagellm::optest {
namespace {

struct Fp8Case {
  int64_t n, k, m;
  DType host = DType::kF8B32;  // how the weights reach upload_weight (F8B32: the loader's type)
  DType out = DType::kBF16;
  bool bias = false;
  bool add = false;      // matmul_add onto random values
  bool per_row = false;  // one scale a row (a per-channel checkpoint): kept as F8Row
};

// F8G128 blocks as F8B32 (the same codes, each group's scale on its four blocks): what the CPU
// multiplies, and what the loader hands a device for an FP8 checkpoint.
std::vector<uint8_t> as_f8b32(const std::vector<uint8_t>& g128, int64_t n) {
  std::vector<uint8_t> out(dtype_bytes(DType::kF8B32, n));
  const auto* src = reinterpret_cast<const BlockF8G128*>(g128.data());
  auto* dst = reinterpret_cast<BlockF8B32*>(out.data());
  for (int64_t g = 0; g < n / 128; ++g)
    for (int j = 0; j < 4; ++j) {
      dst[4 * g + j].d = src[g].d;
      std::memcpy(dst[4 * g + j].q, src[g].q + 32 * j, 32);
    }
  return out;
}

// Random weights as F8G128 blocks (one scale per 128 values, from_f32's; per_row: each row's
// largest magnitude to 448, one scale for the row, as a per-channel checkpoint has).
std::vector<uint8_t> random_g128(Rng& rng, int64_t m, int64_t k, bool per_row = false) {
  const std::vector<float> w = random_bf16_values(rng, m * k);
  std::vector<uint8_t> bytes(dtype_bytes(DType::kF8G128, m * k));
  from_f32(DType::kF8G128, w.data(), bytes.data(), m * k);
  if (!per_row) return bytes;
  auto* b = reinterpret_cast<BlockF8G128*>(bytes.data());
  for (int64_t r = 0; r < m; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
    const float d = amax / 448.0f;
    for (int64_t g = 0; g < k / 128; ++g) {
      BlockF8G128& blk = b[r * (k / 128) + g];
      blk.d = d;
      for (int j = 0; j < 128; ++j) blk.q[j] = f32_to_e4m3(w[r * k + g * 128 + j] / d);
    }
  }
  return bytes;
}

// x as the device quantizes it for the FP8 GEMM: each row's 128-column groups (per_row false)
// or each whole row with its largest magnitude to 448, round to nearest even; rows past n_q as
// they are.
std::vector<float> quantized_x(const std::vector<float>& x, int64_t n_q, int64_t k, bool per_row) {
  std::vector<float> out = x;
  const int64_t span = per_row ? k : 128;
  for (int64_t s0 = 0; s0 < n_q * k; s0 += span) {
    float amax = 0.0f;
    for (int64_t i = s0; i < s0 + span; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 448.0f;
    for (int64_t i = s0; i < s0 + span; ++i)
      out[i] = d > 0.0f ? d * e4m3_to_f32(f32_to_e4m3(x[i] / d)) : 0.0f;
  }
  return out;
}

std::unique_ptr<Buffer> upload_kept(Backend& cuda, const Tensor& host, Tensor& dev) {
  std::unique_ptr<Buffer> storage;
  auto up = cuda.upload_weight(host, DType::kF8G128, storage);
  EXPECT_TRUE(up.ok()) << up.status().to_string();
  if (up.ok()) dev = *up;
  return storage;
}

void run_fp8_case(Backend& cuda, Backend& cpu, uint64_t seed, const Fp8Case& c) {
  Rng rng(seed);
  std::vector<uint8_t> g128 = random_g128(rng, c.m, c.k, c.per_row);
  std::vector<uint8_t> b32 = as_f8b32(g128, c.m * c.k);
  const Tensor w_ref(b32.data(), DType::kF8B32, {c.m, c.k});
  const Tensor w_host = c.host == DType::kF8B32 ? w_ref : Tensor(g128.data(), c.host, {c.m, c.k});
  ASSERT_EQ(cuda.quantized_storage(c.host, c.m, c.k), DType::kF8G128);
  Tensor w_dev;
  auto w_storage = upload_kept(cuda, w_host, w_dev);
  ASSERT_EQ(w_dev.dtype, c.per_row ? DType::kF8Row : DType::kF8G128);
  const std::string what =
      Label(c.add ? "fp8 matmul_add" : "fp8 matmul", seed)("n", c.n)("k", c.k)("m", c.m)(
          "w", dtype_name(c.host))("out", dtype_name(c.out))("bias", c.bias)("per_row", c.per_row);
  QuantizedMatmulRun r =
      run_quantized_matmul(cuda, rng, w_dev, {c.n, c.k, c.m, c.out, c.bias, c.add}, what);

  // Past the GEMV on FP8 tensor cores x is quantized as the device does (quantized_x): the
  // products are then exact, but Hopper's FP8 mma adds them with about 14 bits (DeepSeek-V3's
  // report, 3.3.2; cuBLASLt promotes to fp32 once per 128 columns), so each output may be off by
  // 2^-12 of the sum of its terms' magnitudes. Rows past the last whole four go through the GEMV,
  // whose products are exact (e4m3 values and x are bf16, the sums fp32, the scale applied to a
  // group's sum) and take no slack. Without FP8 tensor cores the weights reach cuBLASLt
  // dequantized to bf16 (sliced_gemm_slack).
  const bool w8a8 = c.n > cuda::kFp8GemvMaxRows && cuda::Fp8Matmul::supported();
  const int64_t n4 = w8a8 ? c.n / 4 * 4 : 0;
  std::vector<float> x_ref = quantized_x(r.x, n4, c.k, c.per_row);
  std::vector<float> want(c.n * c.m);
  Tensor want_t = host_f32(want, {c.n, c.m});
  Tensor bias_h = c.bias ? host_f32(r.bias, {c.m}) : Tensor();
  cpu.matmul(host_f32(x_ref, {c.n, c.k}), w_ref, bias_h, want_t);
  for (int64_t i = 0; i < c.n * c.m; ++i) want[i] += r.start[i];
  std::vector<float> slack(c.n * c.m, 0.0f);
  if (c.n > cuda::kFp8GemvMaxRows) {
    std::vector<float> wf(c.m * c.k);
    to_f32(DType::kF8B32, b32.data(), wf.data(), c.m * c.k);
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.m; ++j) {
        if (i < n4) {
          double mag = 0.0;
          for (int64_t l = 0; l < c.k; ++l)
            mag += std::fabs(static_cast<double>(x_ref[i * c.k + l]) * wf[j * c.k + l]);
          slack[i * c.m + j] = static_cast<float>(std::ldexp(mag, -12));
        } else if (!w8a8) {
          slack[i * c.m + j] = sliced_gemm_slack(&r.x[i * c.k], &wf[j * c.k], c.k);
        }
      }
  }
  EXPECT_TRUE(compare(what, r.got, want,
                      c.out == DType::kF32 ? Tol{1e-3, 5e-2, "f32 output"} : kBf16Tol, &slack));
}

// The layout holds the blocks' values exactly: dequantized back to bf16 they equal the host
// blocks' values rounded to bf16, from F8B32 and from F8G128 host blocks.
TEST(Fp8, LayoutRoundTrip) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;  // the reference here is core's to_f32
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
  ASSERT_NE(cb, nullptr);
  uint64_t seed = base_seed() + 9500;
  for (DType t : {DType::kF8B32, DType::kF8G128}) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{16, 128}, {48, 384}, {160, 1408}}) {
      Rng rng(++seed);
      std::vector<uint8_t> g128 = random_g128(rng, m, k);
      std::vector<uint8_t> bytes = t == DType::kF8B32 ? as_f8b32(g128, m * k) : g128;
      const Tensor host(bytes.data(), t, {m, k});
      Tensor dev;
      auto storage = upload_kept(cuda, host, dev);
      // One group a row (k = 128) is one scale a row: F8Row, the same bytes.
      ASSERT_EQ(dev.dtype, k == 128 ? DType::kF8Row : DType::kF8G128);
      EXPECT_EQ(dev.nbytes(), dtype_bytes(DType::kF8G128, m * k));
      DevBuf out(cuda, m * k * 2);
      cuda::launch_fp8_dequantize(dev.data, m, 0, m, k, out.data(), cb->stream());
      std::vector<float> want(m * k);
      to_f32(t, bytes.data(), want.data(), m * k);
      for (float& v : want) v = round_bf16(v);
      const std::vector<float> got = download_bf16(out);
      EXPECT_TRUE(compare(Label("fp8 layout", seed)("type", dtype_name(t))("m", m)("k", k), got,
                          want, kExact));
    }
  }
}

// Every e4m3 code but NaN, subnormals and both zeros included, through the GEMV: x rows that are
// one-hot pick single weights, so out = d * e4m3(q) exactly (f32 out; scales powers of two and
// one that is not).
TEST(Fp8, EveryCodeExact) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  const int64_t m = 32, k = 256, n = 32;
  std::vector<uint8_t> g128(dtype_bytes(DType::kF8G128, m * k));
  auto* blocks = reinterpret_cast<BlockF8G128*>(g128.data());
  const float scales[] = {1.0f, 0.0078125f, 3.0e-3f, 1024.0f};
  for (int64_t b = 0; b < m * k / 128; ++b) {
    blocks[b].d = scales[b % 4];
    for (int j = 0; j < 128; ++j) {
      uint8_t q = static_cast<uint8_t>((b * 128 + j * 37) % 256);
      if ((q & 0x7f) == 0x7f) q ^= 1;  // NaN -> the largest finite value of that sign
      blocks[b].q[j] = q;
    }
  }
  const Tensor host(g128.data(), DType::kF8G128, {m, k});
  Tensor dev;
  auto storage = upload_kept(cuda, host, dev);
  ASSERT_EQ(dev.dtype, DType::kF8G128);
  std::vector<float> wf(m * k);
  to_f32(DType::kF8G128, g128.data(), wf.data(), m * k);
  for (int64_t c0 = 0; c0 < k; c0 += n) {
    std::vector<float> x(n * k, 0.0f);
    for (int64_t i = 0; i < n; ++i) x[i * k + c0 + i] = 1.0f;
    auto x_dev = upload_bf16(cuda, x);
    DevBuf out(cuda, n * m * 4);
    Tensor out_t = out.view(DType::kF32, {n, m});
    cuda.matmul(x_dev->view(DType::kBF16, {n, k}), dev, Tensor(), out_t);
    std::vector<float> want(n * m);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) want[i * m + j] = wf[j * k + c0 + i];
    std::vector<float> got = out.download<float>();
    got.resize(n * m);
    EXPECT_TRUE(compare(Label("fp8 every code", 0)("columns from", c0), got, want, kExact));
  }
}

// --load-format dummy: the device's random FP8 weights are the CPU's F8G128 blocks, byte for byte
// once repacked, whatever the piece size of the device's generation.
TEST(Fp8, RandomWeightsMatchTheCpu) {
  PAGELLM_REQUIRE_CUDA();
  for (auto [m, k] : {std::pair<int64_t, int64_t>{32, 256}, {4096, 4096}}) {
    const DType t = DType::kF8G128;
    std::vector<uint8_t> host(dtype_bytes(t, m * k));
    Tensor h(host.data(), t, {m, k});
    cpu.fill_random(h, 1234, -0.05f, 0.05f);
    Tensor up;
    auto a = upload_kept(cuda, h, up);
    auto b = cuda.allocate(dtype_bytes(t, m * k));
    Tensor made(b->data(), t, {m, k}, Device::kCuda);
    cuda.fill_random(made, 1234, -0.05f, 0.05f);
    std::vector<uint8_t> x(host.size()), y(host.size());
    cuda.copy_to_host(x.data(), up.data, static_cast<int64_t>(x.size()));
    cuda.copy_to_host(y.data(), made.data, static_cast<int64_t>(y.size()));
    ++n_cases_checked();
    EXPECT_TRUE(x == y) << "dummy FP8 weights " << m << "x" << k << " differ from the CPU's";
  }
}

// F8B32 blocks whose scales change within a 128-column group (no checkpoint scheme makes them,
// pagellm's own 32-value quantizer does) are not kept FP8: they go to bf16, values intact.
TEST(Fp8, ScalesWithinGroupsGoToBf16) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  Rng rng(base_seed() + 9600);
  const int64_t m = 16, k = 256;
  const std::vector<float> w = random_bf16_values(rng, m * k);
  std::vector<uint8_t> bytes(dtype_bytes(DType::kF8B32, m * k));
  from_f32(DType::kF8B32, w.data(), bytes.data(), m * k);
  const Tensor host(bytes.data(), DType::kF8B32, {m, k});
  std::unique_ptr<Buffer> storage;
  auto up = cuda.upload_weight(host, DType::kF8G128, storage);
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  ++n_cases_checked();
  EXPECT_EQ(up->dtype, DType::kBF16);
}

TEST(Fp8, EveryBatch) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9700;
  for (DType host : {DType::kF8B32, DType::kF8G128})
    for (int64_t n : {1, 2, 7, 8, 9, 16, 17, 24, 32, 33, 64, 512}) {
      run_fp8_case(cuda, cpu, ++seed, {n, 256, 48, host});
      run_fp8_case(cuda, cpu, ++seed, {n, 1152, 80, host, DType::kF32, true});
    }
}

// Per-channel weights (F8Row): the GEMV as for any scales, and past it x scaled per token and the
// weight per row (cuBLASLt's OUTER_VEC scales).
TEST(Fp8, PerRowScales) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9750;
  for (int64_t n : {1, 7, 16, 32, 33, 64, 512}) {
    run_fp8_case(cuda, cpu, ++seed, {n, 256, 48, DType::kF8B32, DType::kBF16, false, false, true});
    run_fp8_case(cuda, cpu, ++seed, {n, 1152, 80, DType::kF8G128, DType::kF32, true, true, true});
  }
}

TEST(Fp8, AddBiasAndOutputs) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9800;
  for (int64_t n : {1, 5, 13, 40}) {
    run_fp8_case(cuda, cpu, ++seed, {n, 512, 96, DType::kF8B32, DType::kBF16, true, true});
    run_fp8_case(cuda, cpu, ++seed, {n, 1408, 96, DType::kF8B32, DType::kF32, false, true});
  }
}

// Llama-3-8B's projections: the GEMV's K splits (few rows: o_proj and down) and many stripes
// (gate|up), and the sliced GEMM with several slices (down's K).
TEST(Fp8, Llama8BShapes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9900;
  for (int64_t n : {1, 7, 16, 32}) {
    run_fp8_case(cuda, cpu, ++seed, {n, 4096, 4096});
    run_fp8_case(cuda, cpu, ++seed, {n, 4096, 6144});
    run_fp8_case(cuda, cpu, ++seed, {n, 14336, 4096, DType::kF8B32, DType::kBF16, false, true});
  }
  run_fp8_case(cuda, cpu, ++seed, {64, 4096, 6144});
  run_fp8_case(cuda, cpu, ++seed, {33, 14336, 2048, DType::kF8B32, DType::kBF16, false, true});
  run_fp8_case(cuda, cpu, ++seed,
               {64, 4096, 6144, DType::kF8B32, DType::kBF16, false, false, true});
}

}  // namespace
}  // namespace pagellm::optest
