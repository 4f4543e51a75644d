// batched_matmul (the batched GEMV for one or two rows, its short-row form where K is a multiple of
// 64 up to 512, else one strided-batched cuBLASLt GEMM for bf16 weights; the tiled kernel per
// entry for f16/f32 weights) against the CPU reference (one matmul per batch entry): the per-head
// views of DeepSeek's MLA (absorbed query, value up-projection out of kv_b_proj's rows) at the
// V2-Lite, V3 and test-fixture shapes, odd sizes with unaligned strides, f32 outputs, a batch
// stride of 0, and bytes of the output buffer outside the view left untouched.
#include <algorithm>
#include <cstring>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

// One operand: entry b, row r, column c sits at offset + b * batch_stride + r * row_stride + c of
// a flat buffer.
struct Operand {
  int64_t batch_stride = 0, row_stride = 0, offset = 0;
};

struct BatchedCase {
  int64_t batch, n, k, m;
  Operand x, w, out;
  DType w_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
};

// fp32 output: no output rounding, only summation order differs (as for matmul's f32 outputs).
constexpr Tol kF32OutTol{1e-3, 5e-2, "f32 output: fp32 summation order only"};

int64_t extent(const Operand& o, int64_t batch, int64_t rows, int64_t cols) {
  return o.offset + (batch - 1) * o.batch_stride + (rows - 1) * o.row_stride + cols;
}

Tensor view_of(void* base, DType dt, Device dev, const Operand& o, int64_t batch, int64_t rows,
               int64_t cols) {
  Tensor t(base, dt, {batch, rows, cols}, dev);
  t.data = static_cast<char*>(base) + dtype_bytes(dt, o.offset);
  t.stride = {o.batch_stride, o.row_stride, 1, 0};
  return t;
}

void run_batched_case(Backend& cuda, Backend& cpu, uint64_t seed, const BatchedCase& c) {
  Rng rng(seed);
  const int64_t nx = extent(c.x, c.batch, c.n, c.k);
  const int64_t nw = extent(c.w, c.batch, c.m, c.k);
  const int64_t no = extent(c.out, c.batch, c.n, c.m);
  std::vector<float> xv = random_bf16_values(rng, nx);
  std::vector<float> wv = random_bf16_values(rng, nw);
  std::vector<uint8_t> w_bytes(dtype_bytes(c.w_dtype, nw));
  from_f32(c.w_dtype, wv.data(), w_bytes.data(), nw);

  auto x_dev = upload_bf16(cuda, xv);
  DevBuf w_dev(cuda, static_cast<int64_t>(w_bytes.size()));
  w_dev.upload(w_bytes.data(), static_cast<int64_t>(w_bytes.size()));
  const int64_t esz = c.out_dtype == DType::kF32 ? 4 : 2;
  DevBuf out(cuda, no * esz);  // the 0xA5 sentinel everywhere, inside the view and around it
  Tensor out_t = view_of(out.data(), c.out_dtype, Device::kCuda, c.out, c.batch, c.n, c.m);
  cuda.batched_matmul(view_of(x_dev->data(), DType::kBF16, Device::kCuda, c.x, c.batch, c.n, c.k),
                      view_of(w_dev.data(), c.w_dtype, Device::kCuda, c.w, c.batch, c.m, c.k),
                      out_t);

  std::vector<float> want_flat(no, 0.0f);
  Tensor want_t = view_of(want_flat.data(), DType::kF32, Device::kCpu, c.out, c.batch, c.n, c.m);
  cpu.batched_matmul(view_of(xv.data(), DType::kF32, Device::kCpu, c.x, c.batch, c.n, c.k),
                     view_of(w_bytes.data(), c.w_dtype, Device::kCpu, c.w, c.batch, c.m, c.k),
                     want_t);

  const std::string what = Label("batched_matmul", seed)("batch", c.batch)("n", c.n)("k", c.k)(
      "m", c.m)("w", dtype_name(c.w_dtype))("out", dtype_name(c.out_dtype))(
      "x_strides", std::to_string(c.x.batch_stride) + "/" + std::to_string(c.x.row_stride))(
      "w_strides", std::to_string(c.w.batch_stride) + "/" + std::to_string(c.w.row_stride))(
      "out_strides", std::to_string(c.out.batch_stride) + "/" + std::to_string(c.out.row_stride));
  std::vector<char> in_view(no, 0);
  std::vector<float> got, want;
  const auto raw = out.download<uint8_t>();
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t col = 0; col < c.m; ++col) {
        const int64_t i = c.out.offset + b * c.out.batch_stride + r * c.out.row_stride + col;
        in_view[i] = 1;
        const uint8_t* p = raw.data() + i * esz;
        if (esz == 4) {
          float f;
          std::memcpy(&f, p, 4);
          got.push_back(f);
        } else {
          uint16_t h;
          std::memcpy(&h, p, 2);
          got.push_back(bf16_to_f32(h));
        }
        want.push_back(want_flat[i]);
      }
  int64_t clobbered = 0;
  for (int64_t i = 0; i < no; ++i)
    if (!in_view[i])
      for (int64_t b = 0; b < esz; ++b) clobbered += raw[i * esz + b] != DevBuf::kSentinel;
  EXPECT_EQ(clobbered, 0) << what << ": bytes of the output buffer outside the view were written";
  EXPECT_TRUE(guards_ok(what, out));
  EXPECT_TRUE(compare(what, got, want, c.out_dtype == DType::kF32 ? kF32OutTol : kBf16Tol));
}

// Head h of an [n, heads * dim] activation: batch stride dim, row stride heads * dim.
Operand heads_of(int64_t heads, int64_t dim) {
  return {dim, heads * dim, 0};
}

// MLA's absorbed query: per head [n, N+P] x [P+R, N+P]^T -> [n, P+R], weights contiguous.
BatchedCase absorb_case(int64_t heads, int64_t n, int64_t qk, int64_t latent) {
  return {heads, n, qk, latent, heads_of(heads, qk), {latent * qk, qk, 0}, heads_of(heads, latent)};
}
// MLA's value up-projection: per head [n, R] x W_UV_h^T, W_UV_h = rows [h (N+Vd) + N, + Vd) of
// kv_b_proj [H (N+Vd), R].
BatchedCase uv_case(int64_t heads, int64_t n, int64_t nope, int64_t vd, int64_t r) {
  return {heads, n, r, vd, heads_of(heads, r), {(nope + vd) * r, r, nope * r}, heads_of(heads, vd)};
}

TEST(BatchedMatmul, MlaProjections) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 7000;
  for (int64_t n : {1, 2, 7, 19, 111}) {
    run_batched_case(cuda, cpu, ++seed, absorb_case(16, n, 192, 576));  // V2-Lite
    run_batched_case(cuda, cpu, ++seed, uv_case(16, n, 128, 128, 512));
    run_batched_case(cuda, cpu, ++seed, absorb_case(4, n, 24, 40));  // the golden fixtures
    run_batched_case(cuda, cpu, ++seed, uv_case(4, n, 16, 16, 32));
  }
  for (int64_t n : {1, 3}) {
    run_batched_case(cuda, cpu, ++seed, absorb_case(128, n, 192, 576));  // V3
    run_batched_case(cuda, cpu, ++seed, uv_case(128, n, 128, 128, 512));
  }
}

// MLA's expanded keys and values for a prompt of n tokens (deepseek_v2.cpp, expand_kv): every head
// multiplies the same latent rows (batch stride 0, row stride P+R) into its own panel of
// [k_pe | k_nope | v] rows (batch stride n (P+N+Vd), row stride P+N+Vd), k_pe by I_P per head and
// k_nope | v by the head's rows of kv_b_proj.
TEST(BatchedMatmul, MlaExpandedKeysAndValues) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 7050;
  const int64_t H = 16, N = 128, P = 64, R = 512, Vd = 128, W = P + N + Vd;
  for (int64_t n : {1, 2, 7, 111, 1000}) {
    run_batched_case(cuda, cpu, ++seed, {H, n, P, P, {0, P + R, 0}, {P * P, P, 0}, {n * W, W, 0}});
    run_batched_case(cuda, cpu, ++seed,
                     {H, n, R, N + Vd, {0, P + R, P}, {(N + Vd) * R, R, 0}, {n * W, W, P}});
  }
}

TEST(BatchedMatmul, OddSizesStridesAndTypes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 7100;
  // Odd dims, rows padded by one element and operands starting at odd elements: entries that
  // are only 2-byte aligned.
  const BatchedCase odd{3, 5, 7, 19, {8, 25, 1}, {7 * 19 + 3, 7, 5}, {20, 61, 1}};
  run_batched_case(cuda, cpu, ++seed, odd);
  BatchedCase odd_f32 = odd;
  odd_f32.out_dtype = DType::kF32;
  run_batched_case(cuda, cpu, ++seed, odd_f32);
  // f16 and f32 weights: the tiled kernel, once per entry.
  for (DType wt : {DType::kF16, DType::kF32}) {
    BatchedCase c = absorb_case(5, 7, 64, 33);
    c.w_dtype = wt;
    run_batched_case(cuda, cpu, ++seed, c);
    c.out_dtype = DType::kF32;
    run_batched_case(cuda, cpu, ++seed, c);
  }
  // A batch stride of 0: every entry multiplies the same x (GEMM and GEMV).
  run_batched_case(cuda, cpu, ++seed, {4, 8, 16, 24, {0, 16, 0}, {24 * 16, 16, 0}, {24, 96, 0}});
  run_batched_case(cuda, cpu, ++seed, {4, 1, 16, 24, {0, 16, 0}, {24 * 16, 16, 0}, {24, 96, 0}});
  // Two rows whose K is not a multiple of 8: cuBLASLt (or the tiled kernel), not the GEMV.
  run_batched_case(cuda, cpu, ++seed, absorb_case(6, 2, 20, 36));
  // One entry: a plain GEMM through the batched path.
  run_batched_case(cuda, cpu, ++seed,
                   {1, 19, 64, 111, {64, 64, 0}, {111 * 64, 64, 0}, {111, 111, 0}});
}

// Short rows (K a multiple of 64 up to 512, one or two rows of x): the GEMV where 8 lanes share a
// row, at every width it takes, row counts off its 64 rows a block, f32 and bf16 outputs, padded
// rows and a batch stride of 0 for x.
TEST(BatchedMatmul, ShortRowsEveryWidth) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 7200;
  for (int64_t k = 64; k <= 512; k += 64) {
    const int64_t m = 37 + k / 64;
    for (int64_t n : {1, 2}) {
      BatchedCase c{3, n, k, m, {k + 8, 3 * (k + 8), 0}, {(m + 1) * k, k, 8}, {m, 3 * m + 5, 0}};
      c.out_dtype = n == 2 ? DType::kF32 : DType::kBF16;
      run_batched_case(cuda, cpu, ++seed, c);
    }
  }
  run_batched_case(cuda, cpu, ++seed,
                   {5, 2, 192, 130, {0, 200, 0}, {130 * 192, 192, 0}, {130, 650, 0}});
}

}  // namespace
}  // namespace pagellm::optest
