// rope and rope_store_kv against the CPU reference: both rotation layouts, partial rotary dims,
// GQA/MQA head counts, padding slots (< 0), shuffled cache slots and block sizes 16 and 32.
#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

// cos/sin rows for random positions, f32 [n, rd]: cos of the rd/2 frequencies, then their sin.
std::vector<float> make_cos_sin(Rng& rng, int64_t n, int64_t rd) {
  std::vector<float> cs(n * rd);
  for (int64_t i = 0; i < n; ++i) {
    const double pos = static_cast<double>(rng.below(8192));
    for (int64_t j = 0; j < rd / 2; ++j) {
      const double inv_freq =
          std::pow(500000.0, -2.0 * static_cast<double>(j) / static_cast<double>(rd));
      cs[i * rd + j] = static_cast<float>(std::cos(pos * inv_freq));
      cs[i * rd + rd / 2 + j] = static_cast<float>(std::sin(pos * inv_freq));
    }
  }
  return cs;
}

struct RopeKvCase {
  int64_t n, hq, hkv, d, dv, rd;
  bool interleaved;
  int64_t block_size;
  int64_t dq = 0;  // q's head_dim where it differs from k's (DeepSeek MLA); 0: d
  int64_t q_dim() const { return dq > 0 ? dq : d; }
};

void run_rope_store_kv_case(Backend& cuda, Backend& cpu, uint64_t seed, const RopeKvCase& c) {
  Rng rng(seed);
  const int64_t n_blocks = (c.n + c.block_size - 1) / c.block_size + 3;
  std::vector<float> q = random_bf16_values(rng, c.n * c.hq * c.q_dim(), 2.0f);
  std::vector<float> k = random_bf16_values(rng, c.n * c.hkv * c.d, 2.0f);
  std::vector<float> v = random_bf16_values(rng, c.n * c.hkv * c.dv, 2.0f);
  std::vector<float> kc = random_bf16_values(rng, n_blocks * c.block_size * c.hkv * c.d);
  std::vector<float> vc = random_bf16_values(rng, n_blocks * c.block_size * c.hkv * c.dv);
  std::vector<float> cs = make_cos_sin(rng, c.n, c.rd);
  // Distinct slots in shuffled order; every fifth token is padding (-1) and must not be stored.
  std::vector<int32_t> all(n_blocks * c.block_size);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = static_cast<int64_t>(all.size()) - 1; i > 0; --i)
    std::swap(all[i], all[rng.below(i + 1)]);
  std::vector<int32_t> slots(all.begin(), all.begin() + c.n);
  for (int64_t i = 2; i < c.n; i += 5) slots[i] = -1;

  auto q_dev = upload_bf16(cuda, q), k_dev = upload_bf16(cuda, k), v_dev = upload_bf16(cuda, v);
  auto kc_dev = upload_bf16(cuda, kc), vc_dev = upload_bf16(cuda, vc);
  auto cs_dev = upload_raw(cuda, cs);
  auto slots_dev = upload_raw(cuda, slots);
  Tensor q_t = q_dev->view(DType::kBF16, {c.n, c.hq, c.q_dim()});
  Tensor k_t = k_dev->view(DType::kBF16, {c.n, c.hkv, c.d});
  Tensor kc_t = kc_dev->view(DType::kBF16, {n_blocks, c.block_size, c.hkv, c.d});
  Tensor vc_t = vc_dev->view(DType::kBF16, {n_blocks, c.block_size, c.hkv, c.dv});
  cuda.rope_store_kv(q_t, k_t, v_dev->view(DType::kBF16, {c.n, c.hkv, c.dv}),
                     cs_dev->view(DType::kF32, {c.n, c.rd}), c.interleaved,
                     slots_dev->view(DType::kI32, {c.n}), kc_t, vc_t, 1.0f, 1.0f);

  Tensor qh = host_f32(q, {c.n, c.hq, c.q_dim()}), kh = host_f32(k, {c.n, c.hkv, c.d});
  Tensor kch = host_f32(kc, {n_blocks, c.block_size, c.hkv, c.d});
  Tensor vch = host_f32(vc, {n_blocks, c.block_size, c.hkv, c.dv});
  cpu.rope_store_kv(qh, kh, host_f32(v, {c.n, c.hkv, c.dv}), host_f32(cs, {c.n, c.rd}),
                    c.interleaved, Tensor(slots.data(), DType::kI32, {c.n}), kch, vch, 1.0f, 1.0f);

  const std::string what =
      Label("rope_store_kv", seed)("n", c.n)("hq", c.hq)("hkv", c.hkv)("dq", c.q_dim())("d", c.d)(
          "dv", c.dv)("rotary_dim", c.rd)("interleaved", c.interleaved)("block_size", c.block_size);
  EXPECT_TRUE(compare(what + " q", download_bf16(*q_dev), q, kBf16Tol));
  EXPECT_TRUE(compare(what + " k", download_bf16(*k_dev), k, kBf16Tol));
  EXPECT_TRUE(compare(what + " k_cache", download_bf16(*kc_dev), kc, kBf16Tol));
  EXPECT_TRUE(compare(what + " v_cache", download_bf16(*vc_dev), vc, kExact));
  EXPECT_TRUE(compare(what + " v unchanged", download_bf16(*v_dev), v, kExact));
  for (const DevBuf* b : {q_dev.get(), k_dev.get(), kc_dev.get(), vc_dev.get()})
    EXPECT_TRUE(guards_ok(what, *b));
}

TEST(RopeStoreKv, MatchesReference) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 3000;
  for (int64_t n : {1, 7, 19, 111})
    for (bool inter : {false, true}) {
      run_rope_store_kv_case(cuda, cpu, ++seed,
                             {n, 32, 8, 128, 128, 128, inter, 16});                  // Llama-3-8B
      run_rope_store_kv_case(cuda, cpu, ++seed, {n, 16, 1, 64, 64, 64, inter, 16});  // MQA
      run_rope_store_kv_case(cuda, cpu, ++seed,
                             {n, 8, 8, 256, 256, 64, inter, 32});  // partial rotary
      run_rope_store_kv_case(cuda, cpu, ++seed, {n, 4, 2, 96, 64, 32, inter, 16});  // Dv != D
      run_rope_store_kv_case(cuda, cpu, ++seed, {n, 6, 3, 40, 36, 20, inter, 16});  // Dv % 8 != 0
      // DeepSeek-V2-Lite MLA: q heads q_pe | q_nope (192), one latent k_pe | c_kv row (576)
      run_rope_store_kv_case(cuda, cpu, ++seed, {n, 16, 1, 576, 512, 64, inter, 16, 192});
    }
}

void run_rope_case(Backend& cuda, Backend& cpu, uint64_t seed, int64_t n, int64_t h, int64_t d,
                   int64_t rd, bool interleaved, bool two_d) {
  Rng rng(seed);
  std::vector<float> x = random_bf16_values(rng, n * h * d, 2.0f);
  std::vector<float> cs = make_cos_sin(rng, n, rd);
  auto x_dev = upload_bf16(cuda, x);
  auto cs_dev = upload_raw(cuda, cs);
  Tensor xt = two_d ? x_dev->view(DType::kBF16, {n, d}) : x_dev->view(DType::kBF16, {n, h, d});
  cuda.rope(xt, cs_dev->view(DType::kF32, {n, rd}), interleaved);
  Tensor xh = two_d ? host_f32(x, {n, d}) : host_f32(x, {n, h, d});
  cpu.rope(xh, host_f32(cs, {n, rd}), interleaved);
  const std::string what = Label("rope", seed)("n", n)("h", h)("d", d)("rotary_dim", rd)(
      "interleaved", interleaved)("2d", two_d);
  EXPECT_TRUE(compare(what, download_bf16(*x_dev), x, kBf16Tol));
  EXPECT_TRUE(guards_ok(what, *x_dev));
}

TEST(Rope, MatchesReference) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 3100;
  for (int64_t n : {1, 7, 19, 111})
    for (bool inter : {false, true}) {
      run_rope_case(cuda, cpu, ++seed, n, 32, 128, 128, inter, false);
      run_rope_case(cuda, cpu, ++seed, n, 3, 64, 32, inter, false);
      run_rope_case(cuda, cpu, ++seed, n, 1, 64, 64, inter, true);
    }
}

}  // namespace
}  // namespace pagellm::optest
