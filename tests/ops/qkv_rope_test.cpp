// The q|k|v projection with RoPE and the KV-cache write in the GEMV's epilogue
// (GemvEpilogue::kRopeKv, CudaBackend::rms_norm_qkv_rope_store).
//
// Launched directly, the fused GEMV must give bit for bit what the plain GEMV followed by the
// rope_store_kv kernel gives: each row's dot product does not depend on the row it is paired with,
// both store the product rounded to bf16, and both rotate it with rope_rotate. So the direct cases
// compare exactly, for every batch size, split of K, norm (none, weighted, a weight of ones), both
// rotation layouts, partial rotary dims, a bias, and padding slots. Through the backend (whatever
// PAGELLM_GEMV_FUSIONS turns on; gpu-check runs it with "rope" and the norm fusions) the op is
// compared with the CPU backend's composition of rms_norm_matmul and rope_store_kv, within bf16
// rounding plus the slack of a rounded normalized row (fused_projection_test.cpp says why).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_test_util.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_views.h"

namespace pagellm::optest {
namespace {

enum class Norm { kNone, kWeighted, kUnit };

struct QkvCase {
  int64_t n, k;             // tokens, hidden size
  int64_t hq, hkv, dh, rd;  // heads, head dim, rotary dims
  bool interleaved = false;
  bool bias = false;
  Norm norm = Norm::kNone;
  int k_split = 0;  // direct launches: warps per row group (0: the rule)
  int64_t block_size = 16;
  int64_t rows() const { return (hq + 2 * hkv) * dh; }
};

// One case's inputs: x, the stacked weight and bias, the norm weight, the rotary table, the
// slots (shuffled, every fifth token from the third on padding) and the caches' initial values.
struct Inputs {
  std::vector<float> x, w, bias, g, cs, kc, vc;
  std::vector<int32_t> slots;
  int64_t n_blocks = 0;
};

Inputs make_inputs(uint64_t seed, const QkvCase& c) {
  Rng rng(seed);
  Inputs in;
  in.x = random_bf16_values(rng, c.n * c.k, c.norm == Norm::kNone ? 1.0f : 4.0f);
  in.w = random_bf16_values(rng, c.rows() * c.k);
  in.bias = random_bf16_values(rng, c.rows(), 0.5f);
  in.g.resize(c.k);
  for (auto& g : in.g) g = c.norm == Norm::kWeighted ? rng.uniform(0.5f, 1.5f) : 1.0f;
  in.cs = make_cos_sin(rng, c.n, c.rd);
  in.n_blocks = (c.n + c.block_size - 1) / c.block_size + 3;
  in.kc = random_bf16_values(rng, in.n_blocks * c.block_size * c.hkv * c.dh);
  in.vc = random_bf16_values(rng, in.n_blocks * c.block_size * c.hkv * c.dh);
  std::vector<int32_t> all(in.n_blocks * c.block_size);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = static_cast<int64_t>(all.size()) - 1; i > 0; --i)
    std::swap(all[i], all[rng.below(i + 1)]);
  in.slots.assign(all.begin(), all.begin() + c.n);
  for (int64_t i = 2; i < c.n; i += 5) in.slots[i] = -1;
  return in;
}

// The case's device buffers.
struct Device {
  std::unique_ptr<DevBuf> x, w, bias, g, cs, slots, qkv, kc, vc;
  Device(Backend& be, const Inputs& in, const QkvCase& c) {
    x = upload_bf16(be, in.x);
    w = upload_bf16(be, in.w);
    bias = upload_raw(be, in.bias);
    g = upload_raw(be, in.g);
    cs = upload_raw(be, in.cs);
    slots = upload_raw(be, in.slots);
    qkv = std::make_unique<DevBuf>(be, c.n * c.rows() * 2);
    kc = upload_bf16(be, in.kc);
    vc = upload_bf16(be, in.vc);
  }
  Tensor kc_t(const QkvCase& c, int64_t n_blocks) const {
    return kc->view(DType::kBF16, {n_blocks, c.block_size, c.hkv, c.dh});
  }
  Tensor vc_t(const QkvCase& c, int64_t n_blocks) const {
    return vc->view(DType::kBF16, {n_blocks, c.block_size, c.hkv, c.dh});
  }
};

cuda::GemvFusion fusion_of(const QkvCase& c, const Device& d) {
  cuda::GemvFusion f;
  f.eps = 1e-5f;
  f.unit_norm = c.norm == Norm::kUnit;
  if (c.norm == Norm::kWeighted) f.norm_w = static_cast<const float*>(d.g->data());
  f.k_split = c.k_split;
  return f;
}

// Launches the fused GEMV on `fused` and the plain GEMV then rope_store_kv on `plain` (same
// inputs), and compares what each left in q|k|v and the caches, bit for bit.
void run_direct_case(Backend& cuda, uint64_t seed, const QkvCase& c) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
  ASSERT_NE(cb, nullptr);
  const Inputs in = make_inputs(seed, c);
  Device fused(cuda, in, c), plain(cuda, in, c);
  const auto qkv_t = [&](const Device& d) { return d.qkv->view(DType::kBF16, {c.n, c.rows()}); };
  const void* bias = c.bias ? fused.bias->data() : nullptr;

  cuda::GemvRopeKv rk;
  rk.q_rows = c.hq * c.dh;
  rk.k_rows = c.hkv * c.dh;
  rk.head_dim = c.dh;
  rk.rotary_dim = c.rd;
  rk.interleaved = c.interleaved;
  rk.cos_sin = static_cast<const float*>(fused.cs->data());
  rk.cos_sin_ld = c.rd;
  rk.slot_mapping = static_cast<const int32_t*>(fused.slots->data());
  rk.k_cache = cuda::cache_of(fused.kc_t(c, in.n_blocks));
  rk.v_cache = cuda::cache_of(fused.vc_t(c, in.n_blocks));
  cuda::GemvFusion f = fusion_of(c, fused);
  f.epilogue = cuda::GemvEpilogue::kRopeKv;
  f.rope = &rk;
  const Tensor xf = fused.x->view(DType::kBF16, {c.n, c.k});
  const Tensor wf = fused.w->view(DType::kBF16, {c.rows(), c.k});
  ASSERT_TRUE(cuda::gemv_fusion_supported(cuda::rows_of(xf), cuda::rows_of(wf),
                                          cuda::rows_of(qkv_t(fused)), f));
  cuda::launch_gemv(cuda::rows_of(xf), cuda::rows_of(wf), bias, DType::kF32,
                    cuda::rows_of(qkv_t(fused)), cb->stream(), f);

  cuda::GemvFusion pf = fusion_of(c, plain);
  const Tensor xp = plain.x->view(DType::kBF16, {c.n, c.k});
  const Tensor wp = plain.w->view(DType::kBF16, {c.rows(), c.k});
  cuda::launch_gemv(cuda::rows_of(xp), cuda::rows_of(wp), c.bias ? plain.bias->data() : nullptr,
                    DType::kF32, cuda::rows_of(qkv_t(plain)), cb->stream(), pf);
  const Tensor qkv_p = qkv_t(plain);
  const auto heads_at = [&](int64_t col, int64_t heads) {  // heads of q|k|v from column col
    return cuda::heads_of(qkv_p.slice_cols(col, col + heads * c.dh).split_heads(heads, c.dh));
  };
  cuda::launch_rope_store_kv(
      heads_at(0, c.hq), heads_at(c.hq * c.dh, c.hkv), heads_at((c.hq + c.hkv) * c.dh, c.hkv),
      static_cast<const float*>(plain.cs->data()), c.rd, c.rd, c.interleaved,
      static_cast<const int32_t*>(plain.slots->data()), cuda::cache_of(plain.kc_t(c, in.n_blocks)),
      cuda::cache_of(plain.vc_t(c, in.n_blocks)), cb->stream());

  const std::string what = Label("gemv kRopeKv", seed)("n", c.n)("k", c.k)("hq", c.hq)(
      "hkv", c.hkv)("dh", c.dh)("rotary_dim", c.rd)("interleaved", c.interleaved)("bias", c.bias)(
      "norm", static_cast<int>(c.norm))("k_split", c.k_split);
  EXPECT_TRUE(
      compare(what + " q|k|v", download_bf16(*fused.qkv), download_bf16(*plain.qkv), kExact));
  EXPECT_TRUE(
      compare(what + " k_cache", download_bf16(*fused.kc), download_bf16(*plain.kc), kExact));
  EXPECT_TRUE(
      compare(what + " v_cache", download_bf16(*fused.vc), download_bf16(*plain.vc), kExact));
  for (const DevBuf* b : {fused.qkv.get(), fused.kc.get(), fused.vc.get()})
    EXPECT_TRUE(guards_ok(what, *b));
}

// Every batch size on a small odd shape (K of one partial unrolled stretch) for each norm and
// layout; then every split of K; then Llama-3-8B's q|k|v.
TEST(QkvRope, GemvEpilogueMatchesGemvThenRopeKernel) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  uint64_t seed = base_seed() + 12000;
  int cases = 0;
  for (Norm norm : {Norm::kNone, Norm::kWeighted, Norm::kUnit}) {
    for (bool inter : {false, true}) {
      for (int64_t n = 1; n <= 8; ++n) {
        QkvCase c{n, 264, 4, 2, 16, 16, inter, n % 2 == 1, norm};
        run_direct_case(cuda, ++seed, c);
        QkvCase partial{n, 264, 3, 1, 32, 16, inter, n % 2 == 0, norm};  // rotary half the head
        run_direct_case(cuda, ++seed, partial);
        cases += 2;
      }
    }
  }
  for (int split : {1, 2, 4, 8}) {
    for (int64_t n : {1, 5}) {
      QkvCase c{n, 4104, 4, 2, 64, 64, false, n == 5, Norm::kWeighted, split};
      run_direct_case(cuda, ++seed, c);
      ++cases;
    }
  }
  for (int64_t n : {1, 2}) {
    run_direct_case(cuda, ++seed, {n, 4096, 32, 8, 128, 128, false, false, Norm::kUnit});
    ++cases;
  }
  EXPECT_EQ(cases, 3 * 2 * 16 + 8 + 2);
}

// Through the backend against the CPU composition: decode sizes (the fused GEMV where the
// fusions are on) and a prefill size (cuBLASLt and the rope kernel), with and without a bias.
void run_backend_case(Backend& cuda, Backend& cpu, uint64_t seed, const QkvCase& c) {
  const Inputs in = make_inputs(seed, c);
  Device d(cuda, in, c);
  DevBuf h(cuda, c.n * c.k * 2);
  Tensor qkv = d.qkv->view(DType::kBF16, {c.n, c.rows()});
  Tensor q = qkv.slice_cols(0, c.hq * c.dh).split_heads(c.hq, c.dh);
  Tensor k = qkv.slice_cols(c.hq * c.dh, (c.hq + c.hkv) * c.dh).split_heads(c.hkv, c.dh);
  Tensor v = qkv.slice_cols((c.hq + c.hkv) * c.dh, c.rows()).split_heads(c.hkv, c.dh);
  Tensor kc = d.kc_t(c, in.n_blocks), vc = d.vc_t(c, in.n_blocks);
  Tensor h_t = h.view(DType::kBF16, {c.n, c.k});
  const Tensor bias = c.bias ? d.bias->view(DType::kF32, {c.rows()}) : Tensor();
  cuda.rms_norm_qkv_rope_store(d.x->view(DType::kBF16, {c.n, c.k}), d.g->view(DType::kF32, {c.k}),
                               1e-5f, d.w->view(DType::kBF16, {c.rows(), c.k}), bias, h_t, qkv, q,
                               k, v, d.cs->view(DType::kF32, {c.n, c.rd}), c.interleaved,
                               d.slots->view(DType::kI32, {c.n}), kc, vc);

  std::vector<float> x = in.x, g = in.g, cs = in.cs, b = in.bias, kc_h = in.kc, vc_h = in.vc;
  std::vector<float> qkv_h(c.n * c.rows()), h_h(c.n * c.k);
  std::vector<uint16_t> w_bits = to_bf16_bits(in.w);
  std::vector<int32_t> slots = in.slots;
  Tensor qkv_ht = host_f32(qkv_h, {c.n, c.rows()}), h_ht = host_f32(h_h, {c.n, c.k});
  Tensor qh = qkv_ht.slice_cols(0, c.hq * c.dh).split_heads(c.hq, c.dh);
  Tensor kh = qkv_ht.slice_cols(c.hq * c.dh, (c.hq + c.hkv) * c.dh).split_heads(c.hkv, c.dh);
  Tensor vh = qkv_ht.slice_cols((c.hq + c.hkv) * c.dh, c.rows()).split_heads(c.hkv, c.dh);
  Tensor kch = host_f32(kc_h, {in.n_blocks, c.block_size, c.hkv, c.dh});
  Tensor vch = host_f32(vc_h, {in.n_blocks, c.block_size, c.hkv, c.dh});
  cpu.rms_norm_qkv_rope_store(host_f32(x, {c.n, c.k}), host_f32(g, {c.k}), 1e-5f,
                              Tensor(w_bits.data(), DType::kBF16, {c.rows(), c.k}),
                              c.bias ? host_f32(b, {c.rows()}) : Tensor(), h_ht, qkv_ht, qh, kh, vh,
                              host_f32(cs, {c.n, c.rd}), c.interleaved,
                              Tensor(slots.data(), DType::kI32, {c.n}), kch, vch);

  // Slack: a rounding of the normalized row moves an output by ~2^-9 of the spread of its terms
  // (2^-6 of it allowed); a rotated output mixes two outputs of a pair, so the pair's spreads add.
  std::vector<float> spread(c.n * c.rows());
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t r = 0; r < c.rows(); ++r) {
      double s = 0.0;
      for (int64_t e = 0; e < c.k; ++e) {
        const double t = static_cast<double>(h_h[i * c.k + e]) * in.w[r * c.k + e];
        s += t * t;
      }
      spread[i * c.rows() + r] = static_cast<float>(std::sqrt(s));
    }
  }
  std::vector<float> slack(c.n * c.rows());
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t r = 0; r < c.rows(); ++r) {
      const int64_t head0 = r / c.dh * c.dh, dim = r % c.dh;
      int64_t partner = r;  // the other row of its rotary pair
      if (r < (c.hq + c.hkv) * c.dh && dim < c.rd) {
        partner = c.interleaved ? head0 + (dim ^ 1)
                                : head0 + (dim < c.rd / 2 ? dim + c.rd / 2 : dim - c.rd / 2);
      }
      slack[i * c.rows() + r] =
          std::ldexp(spread[i * c.rows() + r] + spread[i * c.rows() + partner], -6);
    }
  }
  const std::string what = Label("rms_norm_qkv_rope_store", seed)("n", c.n)("k", c.k)("hq", c.hq)(
      "hkv", c.hkv)("dh", c.dh)("rotary_dim", c.rd)("interleaved", c.interleaved)("bias", c.bias);
  const std::vector<float> got = download_bf16(*d.qkv);
  EXPECT_TRUE(compare(what + " q|k|v", got, qkv_h, kBf16Tol, &slack));
  // The caches: each stored token's k and v rows exactly as q|k|v holds them, the other slots
  // as they were.
  std::vector<float> kc_want = in.kc, vc_want = in.vc;
  for (int64_t i = 0; i < c.n; ++i) {
    if (in.slots[i] < 0) continue;
    for (int64_t e = 0; e < c.hkv * c.dh; ++e) {
      kc_want[in.slots[i] * c.hkv * c.dh + e] = got[i * c.rows() + c.hq * c.dh + e];
      vc_want[in.slots[i] * c.hkv * c.dh + e] = got[i * c.rows() + (c.hq + c.hkv) * c.dh + e];
    }
  }
  EXPECT_TRUE(compare(what + " k_cache", download_bf16(*d.kc), kc_want, kExact));
  EXPECT_TRUE(compare(what + " v_cache", download_bf16(*d.vc), vc_want, kExact));
  for (const DevBuf* buf : {d.qkv.get(), d.kc.get(), d.vc.get()})
    EXPECT_TRUE(guards_ok(what, *buf));
}

TEST(QkvRope, BackendMatchesCpuComposition) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 12500;
  int cases = 0;
  for (int64_t n : {1, 3, 8, 19}) {
    for (bool inter : {false, true}) {
      run_backend_case(cuda, cpu, ++seed, {n, 264, 4, 2, 16, 16, inter, n == 3, Norm::kWeighted});
      ++cases;
    }
  }
  for (int64_t n : {1, 19}) {  // Llama-3-8B
    run_backend_case(cuda, cpu, ++seed, {n, 4096, 32, 8, 128, 128, false, false, Norm::kWeighted});
    ++cases;
  }
  EXPECT_EQ(cases, 10);
}

}  // namespace
}  // namespace pagellm::optest
