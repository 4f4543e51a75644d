// 4-bit weights on the device (int4_gemm.cu, cuda_int4.cpp) against the CPU reference, which
// multiplies the same host blocks: the repacked layout decoded back bit for bit, random dummy
// weights equal to the CPU's, and matmul / matmul_add at batch 1, 7, 16, 32 (the 4-bit GEMV), 33,
// 64 and 512 (dequantized slices through cuBLASLt), every group size, GGUF Q4_0, odd shapes, bias,
// bf16 and f32 outputs, and the Llama-3-8B projection shapes.
#include "op_test_util.h"
#include "quantized_matmul_run.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::optest {
namespace {

struct Int4Case {
  int64_t n, k, m;
  DType host = DType::kI4G128;  // the checkpoint's type (Q4_0 is kept as I4G32)
  DType out = DType::kBF16;
  bool bias = false;
  bool add = false;  // matmul_add onto random values
};

// Host blocks of random weights in the case's type (quantized by from_f32, round-to-nearest).
std::vector<uint8_t> random_blocks(Rng& rng, DType t, int64_t m, int64_t k) {
  const std::vector<float> w = random_bf16_values(rng, m * k);
  std::vector<uint8_t> bytes(dtype_bytes(t, m * k));
  from_f32(t, w.data(), bytes.data(), m * k);
  return bytes;
}

void run_int4_case(Backend& cuda, Backend& cpu, uint64_t seed, const Int4Case& c) {
  Rng rng(seed);
  std::vector<uint8_t> w_bytes = random_blocks(rng, c.host, c.m, c.k);
  const Tensor w_host(w_bytes.data(), c.host, {c.m, c.k});
  const DType kept = cuda::int4_device_type(c.host);
  ASSERT_EQ(cuda.quantized_storage(c.host, c.m, c.k), kept);
  std::unique_ptr<Buffer> w_storage;
  auto w_dev = cuda.upload_weight(w_host, kept, w_storage);
  ASSERT_TRUE(w_dev.ok()) << w_dev.status().to_string();
  ASSERT_EQ(w_dev->dtype, kept);
  const std::string what = Label(c.add ? "int4 matmul_add" : "int4 matmul", seed)("n", c.n)(
      "k", c.k)("m", c.m)("w", dtype_name(c.host))("out", dtype_name(c.out))("bias", c.bias);
  QuantizedMatmulRun r =
      run_quantized_matmul(cuda, rng, *w_dev, {c.n, c.k, c.m, c.out, c.bias, c.add}, what);

  std::vector<float> want(c.n * c.m);
  Tensor want_t = host_f32(want, {c.n, c.m});
  Tensor bias_h = c.bias ? host_f32(r.bias, {c.m}) : Tensor();
  cpu.matmul(host_f32(r.x, {c.n, c.k}), w_host, bias_h, want_t);
  for (int64_t i = 0; i < c.n * c.m; ++i) want[i] += r.start[i];
  // Past the GEMV's rows the weights reach cuBLASLt rounded to bf16 (sliced_gemm_slack). The
  // GEMV's products are exact (q - z and x are bf16, the sums fp32) and take no slack.
  std::vector<float> slack(c.n * c.m, 0.0f);
  if (c.n > cuda::kInt4GemvMaxRows) {
    std::vector<float> wf(c.m * c.k);
    to_f32(c.host, w_bytes.data(), wf.data(), c.m * c.k);
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.m; ++j)
        slack[i * c.m + j] = sliced_gemm_slack(&r.x[i * c.k], &wf[j * c.k], c.k);
  }
  EXPECT_TRUE(compare(what, r.got, want,
                      c.out == DType::kF32 ? Tol{1e-3, 5e-2, "f32 output"} : kBf16Tol, &slack));
}

// The layout holds the blocks' values exactly: dequantized back to bf16 they equal the host
// blocks' values rounded to bf16, for each group size and for Q4_0.
TEST(Int4, LayoutRoundTrip) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;  // the reference here is core's to_f32
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
  ASSERT_NE(cb, nullptr);
  uint64_t seed = base_seed() + 9100;
  for (DType t : {DType::kI4G32, DType::kI4G64, DType::kI4G128, DType::kQ4_0}) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{16, 128}, {48, 384}, {160, 1024}}) {
      Rng rng(++seed);
      std::vector<uint8_t> bytes = random_blocks(rng, t, m, k);
      // Zero points over their whole range, not just where round-to-nearest put them.
      if (is_group_int4(t))
        for (int64_t b = 0; b < m * k / block_elems(t); ++b)
          bytes[b * block_bytes(t) + 2] = static_cast<uint8_t>(rng.below(16));
      const Tensor host(bytes.data(), t, {m, k});
      std::unique_ptr<Buffer> storage;
      auto dev = cuda.upload_weight(host, cuda::int4_device_type(t), storage);
      ASSERT_TRUE(dev.ok()) << dev.status().to_string();
      EXPECT_EQ(dev->nbytes(), host.nbytes() * (t == DType::kQ4_0 ? 20 : 18) / 18);
      DevBuf out(cuda, m * k * 2);
      cuda::launch_int4_dequantize(dev->data, dev->dtype, 0, m, k, out.data(), cb->stream());
      std::vector<float> want(m * k);
      to_f32(t, bytes.data(), want.data(), m * k);
      for (float& v : want) v = round_bf16(v);
      const std::vector<float> got = download_bf16(out);
      EXPECT_TRUE(compare(Label("int4 layout", seed)("type", dtype_name(t))("m", m)("k", k), got,
                          want, kExact));
    }
  }
}

// --load-format dummy: the device's random 4-bit weights are the CPU's, byte for byte once
// repacked, whatever the piece size of the device's generation.
TEST(Int4, RandomWeightsMatchTheCpu) {
  PAGELLM_REQUIRE_CUDA();
  for (auto [m, k] : {std::pair<int64_t, int64_t>{32, 256}, {4096, 4096}}) {
    const DType t = DType::kI4G128;
    std::vector<uint8_t> host(dtype_bytes(t, m * k));
    Tensor h(host.data(), t, {m, k});
    cpu.fill_random(h, 1234, -0.05f, 0.05f);
    std::unique_ptr<Buffer> a, b;
    auto up = cuda.upload_weight(h, t, a);
    ASSERT_TRUE(up.ok());
    b = cuda.allocate(dtype_bytes(t, m * k));
    Tensor made(b->data(), t, {m, k}, Device::kCuda);
    cuda.fill_random(made, 1234, -0.05f, 0.05f);
    std::vector<uint8_t> x(host.size()), y(host.size());
    cuda.copy_to_host(x.data(), up->data, static_cast<int64_t>(x.size()));
    cuda.copy_to_host(y.data(), made.data, static_cast<int64_t>(y.size()));
    ++n_cases_checked();
    EXPECT_TRUE(x == y) << "dummy 4-bit weights " << m << "x" << k << " differ from the CPU's";
  }
}

TEST(Int4, EveryGroupSizeAndBatch) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9200;
  for (DType t : {DType::kI4G32, DType::kI4G64, DType::kI4G128, DType::kQ4_0})
    for (int64_t n : {1, 2, 7, 8, 9, 16, 17, 24, 32, 33, 64, 512}) {
      run_int4_case(cuda, cpu, ++seed, {n, 256, 48, t});
      run_int4_case(cuda, cpu, ++seed, {n, 1152, 80, t, DType::kF32, true});
    }
}

TEST(Int4, AddBiasAndOutputs) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9300;
  for (int64_t n : {1, 5, 13, 40}) {
    run_int4_case(cuda, cpu, ++seed, {n, 512, 96, DType::kI4G128, DType::kBF16, true, true});
    run_int4_case(cuda, cpu, ++seed, {n, 512, 96, DType::kI4G64, DType::kF32, false, true});
  }
}

// Llama-3-8B's projections at group 128: the GEMV's K splits (few rows: o_proj and down) and
// many stripes (gate|up), and the sliced GEMM with several slices (down's K).
TEST(Int4, Llama8BShapes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9400;
  for (int64_t n : {1, 7, 16, 32}) {
    run_int4_case(cuda, cpu, ++seed, {n, 4096, 4096});
    run_int4_case(cuda, cpu, ++seed, {n, 4096, 6144});
    run_int4_case(cuda, cpu, ++seed, {n, 14336, 4096, DType::kI4G128, DType::kBF16, false, true});
  }
  // Two slices of 3,072 rows; two of 1,024 (K = 14336: at most 1,168 rows a 32 MB slice).
  run_int4_case(cuda, cpu, ++seed, {64, 4096, 6144});
  run_int4_case(cuda, cpu, ++seed, {33, 14336, 2048, DType::kI4G128, DType::kBF16, false, true});
}

}  // namespace
}  // namespace pagellm::optest
