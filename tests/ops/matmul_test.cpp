// matmul (cuBLASLt for bf16 weights, the tiled fallback for f16/f32 weights) against the CPU
// reference: odd sizes, the Llama-3-8B projection shapes, strided (column-slice) inputs and
// outputs at unaligned addresses, bias, bf16 and f32 outputs.
#include "op_test_util.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::optest {
namespace {

struct MatmulCase {
  int64_t n, k, m;
  DType w_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  DType bias_dtype = DType::kF32;
  bool bias = false;
  int64_t x_offset = 0;    // x is columns [x_offset, x_offset + k) of a wider buffer
  int64_t out_offset = 0;  // out is columns [out_offset, out_offset + m) of a wider buffer
  int64_t out_pad = 0;     // extra columns after the slice
  bool force_gemv = false;  // call the GEMV kernel directly instead of matmul()'s choice
};

// fp32 output: no output rounding, only summation order differs: ~sqrt(K) * 2^-24 of the partial
// sums, about 1e-5 of the rms at K = 4096; the floor (5% of the rms) covers cancelling outputs.
constexpr Tol kF32OutTol{1e-3, 5e-2, "f32 output: fp32 summation order only"};

// A case's weight and bias, random, on the host (as the CPU reference reads them) and uploaded.
struct MatmulWeights {
  std::vector<float> w, bias;
  std::vector<uint8_t> w_bytes;  // the weight as stored on the host in w_dtype
  Tensor w_host, w_dev, b_dev;
  std::unique_ptr<Buffer> w_storage, b_storage;
};

std::unique_ptr<MatmulWeights> upload_matmul_weights(Backend& cuda, uint64_t seed,
                                                     const MatmulCase& c) {
  Rng rng(seed ^ 0x77eu);
  auto W = std::make_unique<MatmulWeights>();
  W->w = random_bf16_values(rng, c.m * c.k);
  W->bias = random_bf16_values(rng, c.m, 4.0f);
  // Both backends read exactly these values.
  W->w_bytes.resize(dtype_bytes(c.w_dtype, c.m * c.k));
  from_f32(c.w_dtype, W->w.data(), W->w_bytes.data(), c.m * c.k);
  W->w_host = Tensor(W->w_bytes.data(), c.w_dtype, {c.m, c.k});
  auto w_dev = cuda.upload_weight(W->w_host, c.w_dtype, W->w_storage);
  if (!w_dev.ok()) {
    ADD_FAILURE() << w_dev.status().to_string();
    return nullptr;
  }
  W->w_dev = *w_dev;
  if (c.bias) {
    auto b = cuda.upload_weight(host_f32(W->bias, {c.m}), c.bias_dtype, W->b_storage);
    if (!b.ok()) {
      ADD_FAILURE() << b.status().to_string();
      return nullptr;
    }
    W->b_dev = *b;
  }
  return W;
}

// matmul (or the GEMV) of random x rows with the case's weights W, against the CPU reference.
void check_matmul(Backend& cuda, Backend& cpu, uint64_t seed, const MatmulCase& c,
                  const MatmulWeights& W) {
  Rng rng(seed);
  const int64_t ldx = c.k + c.x_offset + (c.x_offset ? 3 : 0);
  const int64_t ldo = c.m + c.out_offset + c.out_pad;
  std::vector<float> xw = random_bf16_values(rng, c.n * ldx);
  std::vector<float> bias = W.bias;  // a copy: the reference takes a mutable view
  const Tensor& w_host = W.w_host;
  const Tensor* w_dev = &W.w_dev;
  const Tensor& b_dev = W.b_dev;

  auto x_dev = upload_bf16(cuda, xw);
  Tensor x_t = x_dev->view(DType::kBF16, {c.n, ldx}).slice_cols(c.x_offset, c.x_offset + c.k);
  const int64_t esz = c.out_dtype == DType::kF32 ? 4 : 2;
  DevBuf out(cuda, c.n * ldo * esz);  // filled with the 0xA5 sentinel, slice and padding alike
  Tensor out_t = out.view(c.out_dtype, {c.n, ldo}).slice_cols(c.out_offset, c.out_offset + c.m);
  if (c.force_gemv) {
    auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
    ASSERT_NE(cb, nullptr);
    const cuda::RowView xv{x_t.data, x_t.dtype, x_t.rows(), x_t.cols(), x_t.row_stride()};
    const cuda::RowView wv2{w_dev->data, w_dev->dtype, w_dev->rows(), w_dev->cols(), w_dev->row_stride()};
    const cuda::RowView ov{out_t.data, out_t.dtype, out_t.rows(), out_t.cols(), out_t.row_stride()};
    ASSERT_TRUE(cuda::gemv_supported(xv, wv2, ov));
    cuda::launch_gemv(xv, wv2, b_dev.data, b_dev.defined() ? b_dev.dtype : DType::kF32, ov,
                      cb->stream());
  } else {
    cuda.matmul(x_t, *w_dev, b_dev, out_t);
  }

  std::vector<float> want(c.n * c.m);
  Tensor want_t = host_f32(want, {c.n, c.m});
  Tensor bias_h = c.bias ? host_f32(bias, {c.m}) : Tensor();
  cpu.matmul(host_f32(xw, {c.n, ldx}).slice_cols(c.x_offset, c.x_offset + c.k), w_host, bias_h,
             want_t);

  const std::string what =
      Label(c.force_gemv ? "gemv" : "matmul", seed)("n", c.n)("k", c.k)("m", c.m)("w", dtype_name(c.w_dtype))(
          "out", dtype_name(c.out_dtype))("bias", c.bias ? dtype_name(c.bias_dtype) : "none")(
          "x_offset", c.x_offset)("out_offset", c.out_offset)("ldo", ldo);
  std::vector<float> got;
  const auto raw = out.download<uint8_t>();
  int64_t clobbered = 0;
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t col = 0; col < ldo; ++col) {
      const uint8_t* p = raw.data() + (r * ldo + col) * esz;
      if (col >= c.out_offset && col < c.out_offset + c.m) {
        if (esz == 4) {
          float f;
          std::memcpy(&f, p, 4);
          got.push_back(f);
        } else {
          uint16_t h;
          std::memcpy(&h, p, 2);
          got.push_back(bf16_to_f32(h));
        }
      } else {
        for (int64_t b = 0; b < esz; ++b) clobbered += p[b] != DevBuf::kSentinel;
      }
    }
  EXPECT_EQ(clobbered, 0) << what << ": bytes outside the output column slice were written";
  EXPECT_TRUE(guards_ok(what, out));
  // With a bias the product x.w^T is rounded to bf16 before the bias is added (when cuBLASLt
  // cannot take the bias in its epilogue), so an output where a large bias cancels a large
  // product carries the rounding of the product: up to half an ulp of |x.w^T|, i.e. 2^-9 of
  // |want - bias|. That is exactly bf16's precision for the terms; a wrong bias is off by O(1).
  std::vector<float> slack;
  if (c.bias && c.out_dtype != DType::kF32) {
    slack.resize(got.size());
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t col = 0; col < c.m; ++col)
        slack[r * c.m + col] = std::ldexp(std::fabs(want[r * c.m + col] - bias[col]), -8);
  }
  EXPECT_TRUE(compare(what, got, want, c.out_dtype == DType::kF32 ? kF32OutTol : kBf16Tol,
                      slack.empty() ? nullptr : &slack));
}

void run_matmul_case(Backend& cuda, Backend& cpu, uint64_t seed, const MatmulCase& c) {
  const auto W = upload_matmul_weights(cuda, seed, c);
  if (W) check_matmul(cuda, cpu, seed, c, *W);
}

TEST(Matmul, OddSizesBf16) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2000;
  for (auto [k, m] : {std::pair<int64_t, int64_t>{7, 19}, {19, 7}, {64, 111}, {111, 64}, {128, 1}})
    for (int64_t n : {1, 7, 19, 111}) {
      run_matmul_case(cuda, cpu, ++seed, {n, k, m});
      run_matmul_case(cuda, cpu, ++seed, {n, k, m, DType::kBF16, DType::kBF16, DType::kF32, true});
    }
}

TEST(Matmul, Llama8BShapes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2100;
  // q/o_proj 4096x4096, k/v_proj 1024x4096 (8 KV heads x 128), gate/up 14336x4096, down 4096x14336.
  for (int64_t n : {1, 7, 19, 111}) run_matmul_case(cuda, cpu, ++seed, {n, 4096, 4096});
  for (int64_t n : {1, 7, 19, 111})
    run_matmul_case(cuda, cpu, ++seed,
                    {n, 4096, 1024, DType::kBF16, DType::kBF16, DType::kF32, true});
  for (int64_t n : {1, 7, 19}) run_matmul_case(cuda, cpu, ++seed, {n, 4096, 14336});
  for (int64_t n : {1, 7}) run_matmul_case(cuda, cpu, ++seed, {n, 14336, 4096});
}

// The decode GEMV (gemv.cu) directly, whatever matmul() would pick: every batch size it takes,
// K one 8-element piece up to a partial unrolled stretch (8, 72, 264, 4104), odd M (a half-empty
// last warp, in small and many-block grids), bias in every type, bf16 and f32 outputs written into
// column slices.
TEST(Matmul, GemvEveryBatchSize) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2300;
  int cases = 0;
  for (int64_t n = 1; n <= 8; ++n) {
    // 6151 rows: a grid of hundreds of blocks whose last warp has one row.
    for (auto [k, m] : {std::pair<int64_t, int64_t>{8, 3}, {264, 111}, {4104, 1031}, {72, 6151}}) {
      MatmulCase c{n, k, m};
      c.force_gemv = true;
      run_matmul_case(cuda, cpu, ++seed, c);
      c.out_dtype = DType::kF32;
      c.bias = true;
      c.bias_dtype = n % 2 ? DType::kBF16 : DType::kF32;
      c.out_offset = 5;
      c.out_pad = 2;
      run_matmul_case(cuda, cpu, ++seed, c);
      cases += 2;
    }
  }
  EXPECT_EQ(cases, 64);
}

TEST(Matmul, LmHeadLogits) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2200;
  // Llama 3 vocabulary; logits in bf16 and straight to f32.
  run_matmul_case(cuda, cpu, ++seed, {1, 4096, 128256});
  run_matmul_case(cuda, cpu, ++seed, {3, 4096, 128256, DType::kBF16, DType::kF32});
}

TEST(Matmul, StridedAndUnalignedOutputs) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2300;
  for (int64_t n : {1, 7, 19, 111}) {
    // A column slice at an odd element offset: 2-byte aligned pointers and row strides.
    run_matmul_case(cuda, cpu, ++seed,
                    {n, 64, 111, DType::kBF16, DType::kBF16, DType::kF32, false, 3, 5, 2});
    // A fused-QKV-style slice: 16-byte aligned offset into a wider row, with bias.
    run_matmul_case(cuda, cpu, ++seed,
                    {n, 4096, 1024, DType::kBF16, DType::kBF16, DType::kF32, true, 0, 4096, 1024});
    // Strided input as well, f32 output, bf16 bias.
    run_matmul_case(cuda, cpu, ++seed,
                    {n, 128, 256, DType::kBF16, DType::kF32, DType::kBF16, true, 8, 8, 8});
  }
}

TEST(Matmul, F16AndF32WeightsFallback) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2400;
  for (DType wt : {DType::kF16, DType::kF32}) {
    for (int64_t n : {1, 7, 19, 111}) {
      run_matmul_case(cuda, cpu, ++seed, {n, 19, 111, wt});
      run_matmul_case(cuda, cpu, ++seed, {n, 111, 7, wt, DType::kF32, DType::kF32, true, 1, 3, 1});
    }
    run_matmul_case(cuda, cpu, ++seed, {7, 4096, 4096, wt, DType::kBF16, DType::kF32, true});
  }
}

// The plan cache must give the same answer on a repeated shape (cached heuristic) as the first.
TEST(Matmul, RepeatedShapeIsStable) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 2500;
  for (int i = 0; i < 3; ++i) run_matmul_case(cuda, cpu, seed, {19, 4096, 4096});
}

// After Backend::preload_kernels a new row count's product may run its bucket's preloaded
// cuBLASLt algorithm instead of the heuristic's own (gemm.h): it must be as exact. A backend of
// its own, since preloading runs the products seen so far against their weights, which must be
// alive (those of the other tests are gone). Row counts on both sides of the 1,024-row bucket
// step, with and without the bias epilogue, bf16 and f32 outputs.
TEST(Matmul, AfterKernelPreload) {
  PAGELLM_REQUIRE_CUDA();
  (void)cuda;
  auto own = make_cuda_backend(0);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  Backend& be = **own;
  uint64_t seed = base_seed() + 2600;
  const MatmulCase shapes[] = {{64, 1024, 1024, DType::kBF16, DType::kBF16, DType::kF32, true},
                               {64, 512, 768, DType::kBF16, DType::kF32}};
  std::vector<std::unique_ptr<MatmulWeights>> weights;
  for (const MatmulCase& c : shapes) {
    weights.push_back(upload_matmul_weights(be, ++seed, c));
    ASSERT_NE(weights.back(), nullptr);
    check_matmul(be, cpu, ++seed, c, *weights.back());  // the shape's first plan
  }
  be.preload_kernels(1100);
  const int64_t rows[] = {9, 77, 333, 517, 1030};
  for (int64_t n : rows)
    for (size_t i = 0; i < weights.size(); ++i) {
      MatmulCase c = shapes[i];
      c.n = n;
      check_matmul(be, cpu, ++seed, c, *weights[i]);
    }
  // Those row counts ran on their buckets' kernels without a heuristic query, and wait for their
  // own plans (Backend::background_work), which are made only while the device is busy: with it
  // idle nothing happens; with copies queued they are all made; then every row count again, on
  // whichever kernel its refined plan kept.
  be.synchronize();
  ASSERT_TRUE(be.background_work()) << "no plan was made from a bucket";
  ASSERT_TRUE(be.background_work()) << "a plan was refined with the device idle";
  constexpr int64_t kBusyBytes = 512ll << 20;
  const auto busy = be.allocate(2 * kBusyBytes);
  int rounds = 0;
  do {
    for (int i = 0; i < 4; ++i)
      be.copy(busy->data(), static_cast<char*>(busy->data()) + kBusyBytes, kBusyBytes);
  } while (be.background_work() && ++rounds < 100);
  EXPECT_LT(rounds, 100) << "plans still waiting after 100 rounds of queued copies";
  be.synchronize();
  for (int64_t n : rows)
    for (size_t i = 0; i < weights.size(); ++i) {
      MatmulCase c = shapes[i];
      c.n = n;
      check_matmul(be, cpu, ++seed, c, *weights[i]);
    }
}

}  // namespace
}  // namespace pagellm::optest
