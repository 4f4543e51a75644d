// Row ops against the CPU reference: embedding, rms_norm, add_rms_norm, silu_mul, add, to_f32,
// gather_rows, and weight upload conversions.
#include <algorithm>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

const int64_t kRowCounts[] = {1, 7, 19, 111};

// --- upload_weight ---

std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(dtype_bytes(t, static_cast<int64_t>(v.size())));
  from_f32(t, v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}
std::vector<float> decode(DType t, const void* p, int64_t n) {
  std::vector<float> v(n);
  to_f32(t, p, v.data(), n);
  return v;
}

TEST(UploadWeight, ConvertsFloatTypesExactly) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  const std::pair<int64_t, int64_t> kShapes[] = {{1, 7}, {19, 111}, {111, 4096}};
  uint64_t seed = base_seed() + 100;
  for (DType src : kTypes)
    for (DType dst : kTypes)
      for (auto [rows, cols] : kShapes) {
        ++seed;
        Rng rng(seed);
        std::vector<float> v(rows * cols);
        for (auto& x : v) x = rng.uniform(-4.0f, 4.0f);
        auto host_bytes = encode(src, v);
        Tensor host(host_bytes.data(), src, {rows, cols});
        std::unique_ptr<Buffer> storage;
        auto r = cuda.upload_weight(host, dst, storage);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        const Tensor dev = *r;
        EXPECT_EQ(dev.dtype, dst);
        EXPECT_EQ(dev.device, Device::kCuda);
        EXPECT_EQ(dev.size(0), rows);
        EXPECT_EQ(dev.size(1), cols);
        std::vector<uint8_t> back(dtype_bytes(dst, rows * cols));
        cuda.copy_to_host(back.data(), dev.data, static_cast<int64_t>(back.size()));
        // Expected: the source values converted once to the destination type on the host.
        const auto src_vals = decode(src, host_bytes.data(), rows * cols);
        const auto want = decode(dst, encode(dst, src_vals).data(), rows * cols);
        EXPECT_TRUE(compare(Label("upload_weight", seed)("src", dtype_name(src))(
                                "dst", dtype_name(dst))("rows", rows)("cols", cols),
                            decode(dst, back.data(), rows * cols), want, kExact));
      }
}

TEST(UploadWeight, DequantizesBlockFormatsToBf16) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  const DType kQuant[] = {DType::kQ8_0,  DType::kQ4_0,  DType::kQ4_1,
                          DType::kI4G32, DType::kI4G64, DType::kI4G128};
  uint64_t seed = base_seed() + 200;
  for (DType q : kQuant)
    for (auto [rows, blocks] : {std::pair<int64_t, int64_t>{1, 1}, {7, 3}, {111, 4096 / 128}})
      for (DType request : {DType::kBF16, q}) {
        // Asking to keep the quantized type gets bf16 too: none of these row counts is whole
        // 16-row stripes of the 4-bit layout (int4_matmul_test covers those).
        const int64_t cols = blocks * block_elems(q);
        ++seed;
        Rng rng(seed);
        std::vector<float> v(rows * cols);
        for (auto& x : v) x = rng.uniform(-2.0f, 2.0f);
        auto host_bytes = encode(q, v);
        Tensor host(host_bytes.data(), q, {rows, cols});
        std::unique_ptr<Buffer> storage;
        auto r = cuda.upload_weight(host, request, storage);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(r->dtype, DType::kBF16);
        std::vector<uint16_t> back(rows * cols);
        cuda.copy_to_host(back.data(), r->data, rows * cols * 2);
        std::vector<float> want = decode(q, host_bytes.data(), rows * cols);
        for (auto& x : want) x = round_bf16(x);
        EXPECT_TRUE(compare(Label("upload_weight dequantize", seed)("src", dtype_name(q))(
                                "request", dtype_name(request))("rows", rows)("cols", cols),
                            from_bf16_bits(back.data(), rows * cols), want, kExact));
      }
}

TEST(UploadWeight, RejectsBadInputWithStatus) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  std::vector<int32_t> ints(64, 1);
  Tensor t(ints.data(), DType::kI32, {8, 8});
  std::unique_ptr<Buffer> storage;
  auto r = cuda.upload_weight(t, DType::kBF16, storage);
  EXPECT_FALSE(r.ok());
  std::vector<float> f(64, 1.0f);
  Tensor strided = Tensor(f.data(), DType::kF32, {8, 8}).slice_cols(0, 4);
  auto r2 = cuda.upload_weight(strided, DType::kBF16, storage);
  EXPECT_FALSE(r2.ok());
  ++n_cases_checked();
}

// --- embedding ---

// One table, looked up with each row count in `ns`.
void run_embedding_case(Backend& cuda, Backend& cpu, uint64_t seed, int64_t vocab, int64_t d,
                        const std::vector<int64_t>& ns, DType table_dtype) {
  Rng rng(seed);
  std::vector<uint8_t> table_bytes(dtype_bytes(table_dtype, vocab * d));
  if (table_dtype == DType::kBF16) {
    // Random bf16 bit patterns of magnitude [1, 2) with random sign: fast for the 0.5G-value table.
    auto* b = reinterpret_cast<uint16_t*>(table_bytes.data());
    for (int64_t i = 0; i < vocab * d; i += 4) {
      const uint64_t r = rng.next();
      for (int64_t j = 0; j < 4 && i + j < vocab * d; ++j) {
        const uint16_t bits = static_cast<uint16_t>(r >> (16 * j));
        b[i + j] = static_cast<uint16_t>(0x3f80u | (bits & 0x807fu));
      }
    }
  } else {
    std::vector<float> v(vocab * d);
    for (auto& x : v) x = rng.uniform(-1.0f, 1.0f);
    from_f32(table_dtype, v.data(), table_bytes.data(), vocab * d);
  }
  Tensor host_table(table_bytes.data(), table_dtype, {vocab, d});
  std::unique_ptr<Buffer> storage;
  auto dev_table = cuda.upload_weight(host_table, table_dtype, storage);
  ASSERT_TRUE(dev_table.ok()) << dev_table.status().to_string();
  for (int64_t n : ns) {
    std::vector<int32_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(rng.below(vocab));
    ids[0] = static_cast<int32_t>(vocab - 1);  // the last row, to catch an off-by-one bound
    if (n > 1) ids[1] = 0;
    auto ids_dev = upload_raw(cuda, ids);
    DevBuf out(cuda, n * d * 2);
    Tensor out_t = out.view(DType::kBF16, {n, d});
    cuda.embedding(*dev_table, ids_dev->view(DType::kI32, {n}), out_t);

    std::vector<float> want(n * d);
    Tensor want_t = host_f32(want, {n, d});
    cpu.embedding(host_table, Tensor(ids.data(), DType::kI32, {n}), want_t);
    for (auto& x : want) x = round_bf16(x);  // the GPU's output is bf16
    const std::string what =
        Label("embedding", seed)("vocab", vocab)("d", d)("n", n)("table", dtype_name(table_dtype));
    EXPECT_TRUE(compare(what, download_bf16(out), want, kExact));
    EXPECT_TRUE(guards_ok(what, out));
  }
}

TEST(Embedding, SmallTablesAllTypes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 300;
  for (DType t : {DType::kBF16, DType::kF32, DType::kF16})
    for (auto [vocab, d] : {std::pair<int64_t, int64_t>{7, 19}, {111, 64}, {1000, 4096}})
      run_embedding_case(cuda, cpu, ++seed, vocab, d, {1, 7, 19, 111}, t);
}

TEST(Embedding, Llama3VocabBf16) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 400;
  run_embedding_case(cuda, cpu, ++seed, 128256, 4096, {1, 7, 19, 111}, DType::kBF16);
}

// --- rms_norm / add_rms_norm ---

struct NormCase {
  int64_t n, d;
  DType w_dtype;
  bool strided_x;  // x a column slice of a wider buffer
  bool in_place;   // out aliases x
};

void run_rms_norm_case(Backend& cuda, Backend& cpu, uint64_t seed, const NormCase& c) {
  Rng rng(seed);
  const int64_t ld = c.strided_x ? c.d + 5 : c.d;
  std::vector<float> xw = random_bf16_values(rng, c.n * ld, 3.0f);  // the wide buffer
  std::vector<float> w = random_bf16_values(rng, c.d, 2.0f);
  auto x_dev = upload_bf16(cuda, xw);
  Tensor x_t = x_dev->view(DType::kBF16, {c.n, ld}).slice_cols(0, c.d);
  std::unique_ptr<Buffer> w_storage;
  std::vector<float> w_host = w;
  auto w_dev = cuda.upload_weight(host_f32(w_host, {c.d}), c.w_dtype, w_storage);
  ASSERT_TRUE(w_dev.ok());
  DevBuf out(cuda, c.n * c.d * 2);
  Tensor out_t = c.in_place ? x_t : out.view(DType::kBF16, {c.n, c.d});
  cuda.rms_norm(x_t, *w_dev, 1e-5f, out_t);

  std::vector<float> want(c.n * c.d);
  Tensor want_t = host_f32(want, {c.n, c.d});
  cpu.rms_norm(host_f32(xw, {c.n, ld}).slice_cols(0, c.d), host_f32(w, {c.d}), 1e-5f, want_t);
  const std::string what = Label("rms_norm", seed)("n", c.n)("d", c.d)("w", dtype_name(c.w_dtype))(
      "strided_x", c.strided_x)("in_place", c.in_place);
  std::vector<float> got;
  if (c.in_place) {
    const auto all = download_bf16(*x_dev);
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t k = 0; k < c.d; ++k) got.push_back(all[r * ld + k]);
    // The padding columns of the wide buffer must be untouched.
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t k = c.d; k < ld; ++k)
        ASSERT_EQ(all[r * ld + k], xw[r * ld + k])
            << what << ": padding column written at row " << r;
    EXPECT_TRUE(guards_ok(what, *x_dev));
  } else {
    got = download_bf16(out);
    EXPECT_TRUE(guards_ok(what, out));
  }
  EXPECT_TRUE(compare(what, got, want, kBf16Tol));
}

TEST(RmsNorm, MatchesReference) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 500;
  for (int64_t d : {7, 19, 111, 128, 512, 4096, 5120})
    for (int64_t n : kRowCounts)
      for (DType wt : {DType::kF32, DType::kBF16})
        run_rms_norm_case(cuda, cpu, ++seed, {n, d, wt, false, false});
  // Per-head q/k norm shape (Qwen3): [n * heads, head_dim], in place; strided rows.
  run_rms_norm_case(cuda, cpu, ++seed, {111 * 32, 128, DType::kF32, false, true});
  run_rms_norm_case(cuda, cpu, ++seed, {19, 4096, DType::kF32, true, false});
  run_rms_norm_case(cuda, cpu, ++seed, {7, 111, DType::kF32, true, true});
}

void run_add_rms_norm_case(Backend& cuda, Backend& cpu, uint64_t seed, int64_t n, int64_t d,
                           bool in_place) {
  Rng rng(seed);
  std::vector<float> x = random_bf16_values(rng, n * d, 2.0f);
  std::vector<float> res = random_bf16_values(rng, n * d, 4.0f);
  std::vector<float> w = random_bf16_values(rng, d, 2.0f);
  auto x_dev = upload_bf16(cuda, x);
  auto res_dev = upload_bf16(cuda, res);
  std::unique_ptr<Buffer> w_storage;
  auto w_dev = cuda.upload_weight(host_f32(w, {d}), DType::kF32, w_storage);
  ASSERT_TRUE(w_dev.ok());
  DevBuf out(cuda, n * d * 2);
  Tensor x_t = x_dev->view(DType::kBF16, {n, d});
  Tensor res_t = res_dev->view(DType::kBF16, {n, d});
  Tensor out_t = in_place ? x_t : out.view(DType::kBF16, {n, d});
  cuda.add_rms_norm(x_t, res_t, *w_dev, 1e-6f, out_t);

  std::vector<float> want(n * d), want_res = res;
  Tensor want_t = host_f32(want, {n, d});
  Tensor want_res_t = host_f32(want_res, {n, d});
  cpu.add_rms_norm(host_f32(x, {n, d}), want_res_t, host_f32(w, {d}), 1e-6f, want_t);
  const std::string what = Label("add_rms_norm", seed)("n", n)("d", d)("in_place", in_place);
  // The GPU keeps the residual in bf16 (one rounding of x + residual).
  EXPECT_TRUE(compare(what + " residual", download_bf16(*res_dev), want_res, kBf16Tol));
  EXPECT_TRUE(compare(what + " out", download_bf16(in_place ? *x_dev : out), want, kBf16Tol));
  EXPECT_TRUE(guards_ok(what + " residual", *res_dev));
  EXPECT_TRUE(guards_ok(what + " out", in_place ? *x_dev : out));
}

TEST(AddRmsNorm, MatchesReference) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 600;
  for (int64_t d : {7, 19, 24, 111, 2048, 4096})  // 24, 2048, 4096: the 16-byte vector path
    for (int64_t n : kRowCounts)
      for (bool in_place : {false, true}) run_add_rms_norm_case(cuda, cpu, ++seed, n, d, in_place);
}

// --- silu_mul / add / to_f32 / gather_rows ---

TEST(SiluMul, ColumnSlicesOfOneBuffer) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 700;
  for (int64_t f : {7, 19, 24, 111, 2816, 14336})  // 24, 2816, 14336: 16-byte vector path
    for (int64_t n : kRowCounts) {
      ++seed;
      Rng rng(seed);
      // gate and up are the two halves of one [n, 2F] projection output, as a fused gate_up GEMM
      // would produce them.
      std::vector<float> gu = random_bf16_values(rng, n * 2 * f, 6.0f);
      auto gu_dev = upload_bf16(cuda, gu);
      Tensor gu_t = gu_dev->view(DType::kBF16, {n, 2 * f});
      DevBuf out(cuda, n * f * 2);
      Tensor out_t = out.view(DType::kBF16, {n, f});
      cuda.silu_mul(gu_t.slice_cols(0, f), gu_t.slice_cols(f, 2 * f), out_t);
      std::vector<float> want(n * f);
      Tensor want_t = host_f32(want, {n, f});
      Tensor gu_h = host_f32(gu, {n, 2 * f});
      cpu.silu_mul(gu_h.slice_cols(0, f), gu_h.slice_cols(f, 2 * f), want_t);
      const std::string what = Label("silu_mul", seed)("n", n)("f", f);
      EXPECT_TRUE(compare(what, download_bf16(out), want, kBf16Tol));
      EXPECT_TRUE(guards_ok(what, out));
    }
}

TEST(Add, MatchesReferenceAndAliases) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 800;
  for (int64_t d : {7, 19, 4096})
    for (int64_t n : kRowCounts)
      for (bool in_place : {false, true}) {
        ++seed;
        Rng rng(seed);
        std::vector<float> a = random_bf16_values(rng, n * d), b = random_bf16_values(rng, n * d);
        auto a_dev = upload_bf16(cuda, a);
        auto b_dev = upload_bf16(cuda, b);
        DevBuf out(cuda, n * d * 2);
        Tensor a_t = a_dev->view(DType::kBF16, {n, d});
        Tensor out_t = in_place ? a_t : out.view(DType::kBF16, {n, d});
        cuda.add(a_t, b_dev->view(DType::kBF16, {n, d}), out_t);
        std::vector<float> want(n * d);
        Tensor want_t = host_f32(want, {n, d});
        cpu.add(host_f32(a, {n, d}), host_f32(b, {n, d}), want_t);
        const std::string what = Label("add", seed)("n", n)("d", d)("in_place", in_place);
        const DevBuf& res = in_place ? *a_dev : out;
        EXPECT_TRUE(compare(what, download_bf16(res), want, kBf16Tol));
        EXPECT_TRUE(guards_ok(what, res));
      }
}

TEST(ToF32, ExactConversion) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 900;
  for (int64_t d : {7, 19, 128256})
    for (int64_t n : kRowCounts) {
      ++seed;
      Rng rng(seed);
      std::vector<float> x = random_bf16_values(rng, n * d, 30.0f);
      auto x_dev = upload_bf16(cuda, x);
      DevBuf out(cuda, n * d * 4);
      Tensor out_t = out.view(DType::kF32, {n, d});
      cuda.to_f32(x_dev->view(DType::kBF16, {n, d}), out_t);
      std::vector<float> want(n * d);
      Tensor want_t = host_f32(want, {n, d});
      cpu.to_f32(host_f32(x, {n, d}), want_t);
      const std::string what = Label("to_f32", seed)("n", n)("d", d);
      EXPECT_TRUE(compare(what, out.download<float>(), want, kExact));
      EXPECT_TRUE(guards_ok(what, out));
    }
}

TEST(GatherRows, ExactCopy) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 1000;
  for (int64_t d : {7, 19, 4096})
    for (int64_t n : kRowCounts)
      for (int64_t m : {int64_t{1}, std::min<int64_t>(n, 5), n}) {
        ++seed;
        Rng rng(seed);
        std::vector<float> x = random_bf16_values(rng, n * d);
        std::vector<int32_t> rows(m);
        for (auto& r : rows) r = static_cast<int32_t>(rng.below(n));
        rows[m - 1] = static_cast<int32_t>(n - 1);  // the last row, as for a prefill's logits
        auto x_dev = upload_bf16(cuda, x);
        auto rows_dev = upload_raw(cuda, rows);
        DevBuf out(cuda, m * d * 2);
        Tensor out_t = out.view(DType::kBF16, {m, d});
        cuda.gather_rows(x_dev->view(DType::kBF16, {n, d}), rows_dev->view(DType::kI32, {m}),
                         out_t);
        std::vector<float> want(m * d);
        Tensor want_t = host_f32(want, {m, d});
        cpu.gather_rows(host_f32(x, {n, d}), Tensor(rows.data(), DType::kI32, {m}), want_t);
        const std::string what = Label("gather_rows", seed)("n", n)("d", d)("m", m);
        EXPECT_TRUE(compare(what, download_bf16(out), want, kExact));
        EXPECT_TRUE(guards_ok(what, out));
      }
}

}  // namespace
}  // namespace pagellm::optest
