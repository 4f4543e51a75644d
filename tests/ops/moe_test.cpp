// Mixture-of-experts ops on CUDA against the CPU reference: moe_route for every scoring function
// and top-k method (ids exact, weights within f32 rounding), including logits and biases drawn
// from a handful of values so that ties are everywhere; moe_experts on both of its paths (grouped
// GEMV and per-expert cuBLASLt) for 1, 2, 7, 64 and 300 tokens, Mixtral's routing (8 experts,
// top 2) and DeepSeek-V2-Lite's (64 experts, top 6) with and without shared experts, experts that
// receive no tokens, all tokens on one expert, 4-bit and FP8 experts; and a recorded graph of
// routing + experts replayed on new logits, which must route them anew on the device.
#include "op_test_util.h"

#include <algorithm>
#include <initializer_list>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::optest {
namespace {

using MoePath = cuda::CudaBackend::MoePath;

cuda::CudaBackend& as_cuda(Backend& b) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&b);
  PAGELLM_CHECK_MSG(cb != nullptr, "the op tests' CUDA backend is a CudaBackend");
  return *cb;
}

std::vector<float> ints_as_floats(const std::vector<int32_t>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// --- moe_route ---

struct RouteCase {
  const char* name;
  int64_t n_experts;
  MoeRouteParams p;
  bool tied = false;  // logits (and the bias) drawn from a few values: ties everywhere
};

MoeRouteParams route_params(int32_t k, MoeScoreFunc s, MoeSelect sel, int32_t groups = 1,
                            int32_t keep = 1, bool norm = false, float scale = 1.0f) {
  MoeRouteParams p;
  p.top_k = k;
  p.scoring = s;
  p.select = sel;
  p.n_group = groups;
  p.topk_group = keep;
  p.norm_topk_prob = norm;
  p.routed_scaling_factor = scale;
  return p;
}

// The scores are f32 roundings of the same double-precision values on both sides (exp in double;
// only the softmax sum's order differs), so weights agree to a few ulp.
constexpr Tol kRouteWeightTol{1e-6, 0.0,
                              "f32 rounding of double-precision scores summed in another order"};

void run_route_case(Backend& cuda, Backend& cpu, uint64_t seed, const RouteCase& c, int64_t n) {
  Rng rng(seed);
  const int64_t E = c.n_experts, K = c.p.top_k;
  std::vector<float> logits(n * E), bias;
  const float levels[] = {-1.0f, 0.0f, 0.5f, 1.0f};
  for (float& l : logits) l = c.tied ? levels[rng.below(4)] : rng.uniform(-4.0f, 4.0f);
  const bool noaux = c.p.select == MoeSelect::kNoauxTc;
  if (noaux) {
    bias.resize(E);
    for (float& b : bias)
      b = c.tied ? 0.25f * static_cast<float>(rng.below(2)) : rng.uniform(-0.1f, 0.1f);
  }
  auto logits_dev = upload_raw(cuda, logits);
  auto bias_dev = noaux ? upload_raw(cuda, bias) : nullptr;
  DevBuf ids_dev(cuda, n * K * 4), w_dev(cuda, n * K * 4);
  Tensor ids_t = ids_dev.view(DType::kI32, {n, K}), w_t = w_dev.view(DType::kF32, {n, K});
  cuda.moe_route(logits_dev->view(DType::kF32, {n, E}),
                 noaux ? bias_dev->view(DType::kF32, {E}) : Tensor(), c.p, ids_t, w_t);

  std::vector<int32_t> want_ids(n * K);
  std::vector<float> want_w(n * K);
  Tensor hi(want_ids.data(), DType::kI32, {n, K});
  Tensor hw = host_f32(want_w, {n, K});
  cpu.moe_route(host_f32(logits, {n, E}), noaux ? host_f32(bias, {E}) : Tensor(), c.p, hi, hw);

  const std::string what = Label("moe_route", seed)("case", c.name)("n", n)("E", E)("K", K);
  std::vector<int32_t> got_ids = ids_dev.download<int32_t>();
  got_ids.resize(n * K);
  std::vector<float> got_w = w_dev.download<float>();
  got_w.resize(n * K);
  EXPECT_TRUE(compare(what + " ids", ints_as_floats(got_ids), ints_as_floats(want_ids), kExact));
  EXPECT_TRUE(compare(what + " weights", got_w, want_w, kRouteWeightTol));
  EXPECT_TRUE(guards_ok(what + " ids", ids_dev));
  EXPECT_TRUE(guards_ok(what + " weights", w_dev));
}

TEST(MoeRoute, EveryMethodAgainstTheCpu) {
  PAGELLM_REQUIRE_CUDA();
  const std::vector<RouteCase> cases = {
      {"mixtral", 8, route_params(2, MoeScoreFunc::kSoftmax, MoeSelect::kGreedy, 1, 1, true)},
      {"v2-lite", 64, route_params(6, MoeScoreFunc::kSoftmax, MoeSelect::kGreedy)},
      {"v2", 160,
       route_params(6, MoeScoreFunc::kSoftmax, MoeSelect::kGroupLimitedGreedy, 8, 3, false, 16.0f)},
      {"v2-group-fixture", 8,
       route_params(2, MoeScoreFunc::kSoftmax, MoeSelect::kGroupLimitedGreedy, 4, 2)},
      {"v3", 256, route_params(8, MoeScoreFunc::kSigmoid, MoeSelect::kNoauxTc, 8, 4, true, 2.5f)},
      {"v3-fixture", 8,
       route_params(3, MoeScoreFunc::kSigmoid, MoeSelect::kNoauxTc, 4, 2, true, 2.5f)},
      {"sigmoid-greedy", 64,
       route_params(4, MoeScoreFunc::kSigmoid, MoeSelect::kGreedy, 1, 1, true)},
      // More experts than the kept groups hold: the rest come from dropped groups.
      {"v2-k-past-groups", 16,
       route_params(6, MoeScoreFunc::kSoftmax, MoeSelect::kGroupLimitedGreedy, 8, 2)},
  };
  uint64_t seed = base_seed() + 9000;
  for (const RouteCase& c : cases) {
    for (bool tied : {false, true}) {
      RouteCase tc = c;
      tc.tied = tied;
      for (int64_t n : {1, 7, 64, 300}) run_route_case(cuda, cpu, ++seed, tc, n);
    }
  }
}

// --- moe_experts ---

enum class Routing { kRandom, kOddExperts, kAllOnFew };

struct ExpertsCase {
  int64_t E, K, D, F;
  bool shared;
  Routing routing = Routing::kRandom;
  // The experts' type: bf16, or a quantized checkpoint type the device keeps quantized: the I4G
  // types and GGUF's Q4_0 (4-bit), F8G128 (FP8, one scale per 128 values of a row).
  DType weights = DType::kBF16;
};

// Inputs of one case on both backends: the same values.
struct ExpertsInputs {
  int64_t n;
  std::vector<float> h, shared, weights;
  std::vector<int32_t> ids;
  std::vector<float> gate_up, down;  // the experts' values: [E, 2F, D], [E, D, F]
  std::unique_ptr<DevBuf> h_dev, shared_dev, ids_dev, w_dev;
  Tensor gu_dev, dn_dev;  // [E, 2F, D], [E, D, F] on the device
  std::vector<std::unique_ptr<Buffer>> storage;
};

// Random expert weights [rows, cols] of type t, uniform in +-amp before rounding to it: their
// values (what the reference multiplies) and the device tensor holding them.
Tensor random_experts(Backend& cuda, Rng& rng, DType t, int64_t rows, int64_t cols, float amp,
                      std::vector<float>& values, std::vector<std::unique_ptr<Buffer>>& storage) {
  values.resize(rows * cols);
  if (t == DType::kBF16) {
    std::vector<uint16_t> bits(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      bits[i] = f32_to_bf16(rng.uniform(-amp, amp));
      values[i] = bf16_to_f32(bits[i]);
    }
    storage.push_back(cuda.must_allocate(rows * cols * 2, "test experts"));
    cuda.copy_from_host(storage.back()->data(), bits.data(), rows * cols * 2);
    return Tensor(storage.back()->data(), DType::kBF16, {rows, cols}, Device::kCuda);
  }
  for (float& v : values) v = rng.uniform(-amp, amp);
  std::vector<uint8_t> bytes(dtype_bytes(t, rows * cols));
  from_f32(t, values.data(), bytes.data(), rows * cols);
  to_f32(t, bytes.data(), values.data(), rows * cols);
  const DType kept = cuda::kept_type(t);
  PAGELLM_CHECK(cuda.quantized_storage(t, rows, cols) == kept);
  Result<Tensor> w =
      cuda.upload_weight(Tensor(bytes.data(), t, {rows, cols}), kept, storage.emplace_back());
  PAGELLM_CHECK_MSG(w.ok(), w.status().to_string().c_str());
  cuda.synchronize();
  return *w;
}

ExpertsInputs make_inputs(Backend& cuda, Rng& rng, const ExpertsCase& c, int64_t n) {
  ExpertsInputs in;
  in.n = n;
  in.h = random_bf16_values(rng, n * c.D);
  in.shared = random_bf16_values(rng, n * c.D);
  in.gu_dev = random_experts(cuda, rng, c.weights, c.E * 2 * c.F, c.D,
                             1.0f / std::sqrt(static_cast<float>(c.D)), in.gate_up, in.storage)
                  .reshape({c.E, 2 * c.F, c.D});
  in.dn_dev = random_experts(cuda, rng, c.weights, c.E * c.D, c.F,
                             1.0f / std::sqrt(static_cast<float>(c.F)), in.down, in.storage)
                  .reshape({c.E, c.D, c.F});
  in.ids.resize(n * c.K);
  in.weights.resize(n * c.K);
  // A token's experts in random order (routing lists them best first, not by index), drawn from
  // all experts, from the odd ones only (K <= E / 2), or fixed: E/2 + K - 1 down to E/2.
  std::vector<int32_t> pool;
  for (int32_t e = c.routing == Routing::kOddExperts ? 1 : 0; e < c.E;
       e += c.routing == Routing::kOddExperts ? 2 : 1)
    pool.push_back(e);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = static_cast<int64_t>(pool.size()) - 1; i > 0; --i)
      std::swap(pool[i], pool[rng.below(i + 1)]);
    for (int64_t k = 0; k < c.K; ++k) {
      in.ids[t * c.K + k] =
          c.routing == Routing::kAllOnFew ? static_cast<int32_t>(c.E / 2 + c.K - 1 - k) : pool[k];
      in.weights[t * c.K + k] = rng.uniform(0.05f, 1.0f);
    }
  }
  in.h_dev = upload_bf16(cuda, in.h);
  in.shared_dev = upload_bf16(cuda, in.shared);
  in.ids_dev = upload_raw(cuda, in.ids);
  in.w_dev = upload_raw(cuda, in.weights);
  return in;
}

MoeExpertWeights device_weights(const ExpertsCase&, const ExpertsInputs& in) {
  MoeExpertWeights w;
  w.gate_up = in.gu_dev;
  w.down = in.dn_dev;
  return w;
}

MoeExpertWeights host_weights(const ExpertsCase& c, ExpertsInputs& in) {
  MoeExpertWeights w;
  w.gate_up = host_f32(in.gate_up, {c.E, 2 * c.F, c.D});
  w.down = host_f32(in.down, {c.E, c.D, c.F});
  return w;
}

// Root-sum-square over f of the down product's terms act_f * W_down[d, f] of token t's expert e,
// per output element d (act_f = silu(gate_f) * up_f in fp32): the scale of the rounding error that
// the device's bf16 activations carry into that output, however much the terms cancel.
std::vector<float> down_term_rss(const ExpertsCase& c, const ExpertsInputs& in, int64_t t, int32_t e) {
  std::vector<float> act(c.F);
  const float* gu = in.gate_up.data() + static_cast<int64_t>(e) * 2 * c.F * c.D;
  const float* h = in.h.data() + t * c.D;
  for (int64_t f = 0; f < c.F; ++f) {
    float g = 0.0f, u = 0.0f;
    for (int64_t d = 0; d < c.D; ++d) {
      g += h[d] * gu[f * c.D + d];
      u += h[d] * gu[(c.F + f) * c.D + d];
    }
    act[f] = g / (1.0f + std::exp(-g)) * u;
  }
  const float* dn = in.down.data() + static_cast<int64_t>(e) * c.D * c.F;
  std::vector<float> rss(c.D);
  for (int64_t d = 0; d < c.D; ++d) {
    double ss = 0.0;
    for (int64_t f = 0; f < c.F; ++f) {
      const double term = act[f] * dn[d * c.F + f];
      ss += term * term;
    }
    rss[d] = static_cast<float>(std::sqrt(ss));
  }
  return rss;
}

// The reference, and a per-element slack for the device's bf16 intermediates. The device rounds
// gate and up (GEMM path) and the activation (both paths) to bf16 before the down product: each
// term of that sum carries up to about 3 x 2^-9 relative error, independent across terms, so the
// error of an output is a random sum with standard deviation below 2^-9 x its terms' root-sum-
// square; 2^-5 x that (16 standard deviations) per expert, times the routing weight, does not
// fail by chance, and stays far below one expert's whole contribution (the size of a wrong expert,
// weight or order, about the root-sum-square itself for random weights). On top, 2^-8 of
// |w_k y_k|: each expert's output rounded to bf16 before the weighted sum. 4-bit experts: the
// grouped 4-bit GEMV rounds as the GEMM path does (its products are exact); per-expert products
// past its rows multiply the weights rounded to bf16, an error of the same size as the rounding of
// gate and up (2^-9 of each term), which the same slack covers.
void reference(Backend& cpu, const ExpertsCase& c, ExpertsInputs& in, std::vector<float>& want,
               std::vector<float>& slack) {
  const int64_t n = in.n;
  const MoeExpertWeights w = host_weights(c, in);
  Tensor h = host_f32(in.h, {n, c.D});
  want.assign(n * c.D, 0.0f);
  Tensor want_t = host_f32(want, {n, c.D});
  cpu.moe_experts(h, Tensor(in.ids.data(), DType::kI32, {n, c.K}), host_f32(in.weights, {n, c.K}),
                  w, c.shared ? host_f32(in.shared, {n, c.D}) : Tensor(), want_t);
  slack.assign(n * c.D, 0.0f);
  std::vector<int32_t> ids_k(n);
  std::vector<float> ones(n, 1.0f), y(n * c.D);
  Tensor y_t = host_f32(y, {n, c.D});
  for (int64_t k = 0; k < c.K; ++k) {
    for (int64_t t = 0; t < n; ++t) ids_k[t] = in.ids[t * c.K + k];
    cpu.moe_experts(h, Tensor(ids_k.data(), DType::kI32, {n, 1}), host_f32(ones, {n, 1}), w,
                    Tensor(), y_t);
    for (int64_t t = 0; t < n; ++t) {
      const float wk = in.weights[t * c.K + k];
      const std::vector<float> rss = down_term_rss(c, in, t, ids_k[t]);
      for (int64_t d = 0; d < c.D; ++d)
        slack[t * c.D + d] += std::ldexp(std::fabs(wk * y[t * c.D + d]), -8) +
                              std::ldexp(wk * rss[d], -5);
    }
  }
}

std::vector<float> run_device(Backend& cuda, const ExpertsCase& c, const ExpertsInputs& in,
                              DevBuf& out, MoePath path) {
  const int64_t n = in.n;
  Tensor out_t = out.view(DType::kBF16, {n, c.D});
  as_cuda(cuda).moe_experts_on_path(
      in.h_dev->view(DType::kBF16, {n, c.D}), in.ids_dev->view(DType::kI32, {n, c.K}),
      in.w_dev->view(DType::kF32, {n, c.K}), device_weights(c, in),
      c.shared ? in.shared_dev->view(DType::kBF16, {n, c.D}) : Tensor(), out_t, path);
  std::vector<float> got = download_bf16(out);
  got.resize(n * c.D);
  return got;
}

const char* path_name(MoePath p) {
  return p == MoePath::kGemv          ? "gemv"
         : p == MoePath::kGemvApart   ? "gemv, down and combine apart"
         : p == MoePath::kGroupedGemm ? "grouped-gemm"
         : p == MoePath::kExpertGemm  ? "expert-gemm"
                                      : "auto";
}

constexpr std::initializer_list<MoePath> kEveryPath = {MoePath::kAuto, MoePath::kGemv,
                                                       MoePath::kGemvApart, MoePath::kGroupedGemm,
                                                       MoePath::kExpertGemm};

void run_experts_case(Backend& cuda, Backend& cpu, uint64_t seed, const ExpertsCase& c, int64_t n,
                      std::initializer_list<MoePath> paths = kEveryPath) {
  Rng rng(seed);
  ExpertsInputs in = make_inputs(cuda, rng, c, n);
  std::vector<float> want, slack;
  reference(cpu, c, in, want, slack);
  const char* routing = c.routing == Routing::kRandom       ? "random"
                        : c.routing == Routing::kOddExperts ? "odd-experts-only"
                                                            : "all-on-K-experts";
  for (MoePath path : paths) {
    const std::string what = Label("moe_experts", seed)("path", path_name(path))("n", n)("E", c.E)(
        "K", c.K)("D", c.D)("F", c.F)("shared", c.shared)("routing", routing);
    DevBuf out(cuda, n * c.D * 2);
    const std::vector<float> got = run_device(cuda, c, in, out, path);
    EXPECT_TRUE(compare(what, got, want, kBf16Tol, &slack));
    EXPECT_TRUE(guards_ok(what, out));
  }
}

// Mixtral's routing (8 experts, top 2) and DeepSeek-V2-Lite's (64, top 6), at widths the plain
// CPU reference covers in seconds; hidden 512 spans two unrolled stretches of the GEMV's loads.
TEST(MoeExperts, MixtralRoutingWithAndWithoutShared) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9100;
  for (bool shared : {false, true})
    for (int64_t n : {1, 2, 7, 64, 300})
      run_experts_case(cuda, cpu, ++seed, {8, 2, 512, 1024, shared}, n);
}

TEST(MoeExperts, DeepSeekV2LiteRoutingWithAndWithoutShared) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9200;
  for (bool shared : {false, true})
    for (int64_t n : {1, 2, 7, 64, 300})
      run_experts_case(cuda, cpu, ++seed, {64, 6, 512, 256, shared}, n);
}

// The real V2-Lite expert shape (hidden 2048, expert width 1408) at decode sizes.
TEST(MoeExperts, DeepSeekV2LiteShape) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9300;
  for (int64_t n : {1, 7}) run_experts_case(cuda, cpu, ++seed, {64, 6, 2048, 1408, true}, n);
}

// The grouped GEMVs alone (no cuBLASLt kernel runs): the case compute-sanitizer's racecheck takes
// for their shared-memory sums (gpu-check forces the gate|up split there), at one token (the
// split's pass width) and a few.
TEST(MoeExperts, GemvPathOnly) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9320;
  for (int64_t n : {1, 3})
    run_experts_case(cuda, cpu, ++seed, {16, 6, 2048, 1408, true}, n, {MoePath::kGemv});
  for (int64_t n : {1, 5})
    run_experts_case(cuda, cpu, ++seed, {8, 2, 264, 136, false}, n, {MoePath::kGemv});
}

// A step of one token makes its down products and combine in one kernel: bit for bit what the
// two kernels give (the paths above hold both to the CPU), with and without shared experts, from
// one expert a token to kMoeFusedCombineMaxTopK, at V2-Lite's and Mixtral's widths and at widths
// of partial load trips; then with a token routed twice to one expert and a pair whose id is out
// of range (no slot), which the combine leaves out.
TEST(MoeExperts, OneTokenDownAndCombineInOneKernel) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  uint64_t seed = base_seed() + 9330;
  const ExpertsCase cases[] = {{64, 6, 2048, 1408, true}, {64, 6, 2048, 1408, false},
                               {8, 2, 4096, 1024, true},  {16, 8, 264, 136, true},
                               {8, 1, 64, 48, false},     {4, 4, 520, 24, true}};
  for (const ExpertsCase& c : cases) {
    for (bool odd_pairs : {false, true}) {
      if (odd_pairs && c.K < 3) continue;
      Rng rng(++seed);
      ExpertsInputs in = make_inputs(cuda, rng, c, 1);
      if (odd_pairs) {
        in.ids[1] = in.ids[0];
        in.ids[2] = static_cast<int32_t>(c.E);
        in.ids_dev = upload_raw(cuda, in.ids);
      }
      const std::string what =
          Label("moe_experts one token, down and combine fused", seed)("E", c.E)("K", c.K)(
              "D", c.D)("F", c.F)("shared", c.shared)("repeated and invalid ids", odd_pairs);
      DevBuf fused(cuda, c.D * 2), apart(cuda, c.D * 2);
      std::vector<float> got = run_device(cuda, c, in, fused, MoePath::kGemv);
      std::vector<float> want = run_device(cuda, c, in, apart, MoePath::kGemvApart);
      EXPECT_TRUE(compare(what, got, want, kExact));
      EXPECT_TRUE(guards_ok(what, fused));
    }
  }
}

// More than 8 experts per token: the combine sums its expert rows in two passes of loads (V3
// routes 8; the backend allows 16).
TEST(MoeExperts, TenExpertsPerToken) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9350;
  for (int64_t n : {1, 7, 64}) run_experts_case(cuda, cpu, ++seed, {16, 10, 256, 128, true}, n);
}

TEST(MoeExperts, ExpertsWithoutTokens) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9400;
  for (int64_t n : {1, 5, 64})
    run_experts_case(cuda, cpu, ++seed, {8, 2, 256, 128, true, Routing::kOddExperts}, n);
}

TEST(MoeExperts, AllTokensOnOneExpert) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9500;
  // One expert with every token: 300 of them in the GEMV's passes of 8, and as one GEMM.
  for (int64_t n : {1, 9, 64, 300})
    run_experts_case(cuda, cpu, ++seed, {8, 1, 256, 128, false, Routing::kAllOnFew}, n);
  // Two experts sharing every token, listed in reverse expert order.
  for (int64_t n : {7, 300})
    run_experts_case(cuda, cpu, ++seed, {8, 2, 256, 128, true, Routing::kAllOnFew}, n);
}

// Quantized experts (kept quantized on the device) on their two paths, the format's grouped GEMV
// and per-expert products: 4-bit with group sizes 128 and 32 and GGUF's Q4_0, and FP8 with
// 128-value scales; Mixtral's and DeepSeek-V2-Lite's routing at decode and prefill sizes,
// V2-Lite's real expert shape, and two experts taking every token (many GEMV passes of 32 slots;
// the pass count sized from a low bound).
TEST(MoeExperts, QuantizedExperts) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9700;
  const std::initializer_list<MoePath> paths = {MoePath::kAuto, MoePath::kGemv,
                                                MoePath::kExpertGemm};
  for (DType t : {DType::kI4G128, DType::kI4G32, DType::kQ4_0, DType::kF8G128}) {
    for (int64_t n : {1, 7, 64, 300}) {
      run_experts_case(cuda, cpu, ++seed, {8, 2, 512, 1024, true, Routing::kRandom, t}, n, paths);
      run_experts_case(cuda, cpu, ++seed, {64, 6, 512, 256, n > 7, Routing::kRandom, t}, n, paths);
    }
  }
  for (DType t : {DType::kI4G128, DType::kF8G128}) {
    for (int64_t n : {1, 7})
      run_experts_case(cuda, cpu, ++seed, {64, 6, 2048, 1408, true, Routing::kRandom, t}, n, paths);
  }
  for (DType t : {DType::kI4G64, DType::kF8G128}) {
    for (int64_t n : {1, 40, 100})
      run_experts_case(cuda, cpu, ++seed, {8, 2, 256, 128, false, Routing::kAllOnFew, t}, n, paths);
  }
}

// The small sizes of the golden fixtures (hidden 64, widths 48 and 32): one partial stretch of
// the GEMV's loads per row.
TEST(MoeExperts, FixtureSizes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9600;
  for (int64_t n : {1, 13, 40}) {
    run_experts_case(cuda, cpu, ++seed, {4, 2, 64, 48, false}, n);
    run_experts_case(cuda, cpu, ++seed, {8, 3, 64, 32, true}, n);
  }
}

// One step of the graph tests below over n tokens: DeepSeek-V2-Lite's routing (64 experts, top 6)
// with narrower experts, random router logits on the device, and room for the routing.
struct RoutedStep {
  ExpertsCase c{64, 6, 512, 256, true};
  MoeRouteParams p = route_params(6, MoeScoreFunc::kSoftmax, MoeSelect::kGreedy);
  ExpertsInputs in;
  std::vector<float> logits;
  std::unique_ptr<DevBuf> logits_dev, ids, wts;
  Tensor logits_t, ids_t, w_t, h_t, shared_t;

  RoutedStep(Backend& cuda, Rng& rng, int64_t n)
      : in(make_inputs(cuda, rng, c, n)), logits(n * c.E) {
    for (float& l : logits) l = rng.uniform(-4.0f, 4.0f);
    logits_dev = upload_raw(cuda, logits);
    ids = std::make_unique<DevBuf>(cuda, n * c.K * 4);
    wts = std::make_unique<DevBuf>(cuda, n * c.K * 4);
    logits_t = logits_dev->view(DType::kF32, {n, c.E});
    ids_t = ids->view(DType::kI32, {n, c.K});
    w_t = wts->view(DType::kF32, {n, c.K});
    h_t = in.h_dev->view(DType::kBF16, {n, c.D});
    shared_t = in.shared_dev->view(DType::kBF16, {n, c.D});
  }
  // Draws new logits into the same device buffer (what a graph replays on).
  void new_logits(Rng& rng) {
    for (float& l : logits) l = rng.uniform(-4.0f, 4.0f);
    logits_dev->upload(logits.data(), static_cast<int64_t>(logits.size() * 4));
  }
};

// Zeros a bf16 output of n rows of d, so a replay must write all of it.
void clear_bf16(DevBuf& out, int64_t n, int64_t d) {
  const std::vector<uint16_t> zeros(n * d, 0);
  out.upload(zeros.data(), static_cast<int64_t>(zeros.size() * 2));
}

// Routing and experts recorded in one graph after a direct run, then replayed on new logits: the
// replay must route the new logits on the device (other experts, other slots) and give, bit for
// bit, what a direct run on those logits gives. 300 tokens take the grouped GEMMs, the others the
// GEMVs: neither path may depend on anything the host learnt when it was recorded.
TEST(MoeExperts, GraphReplayRoutesNewLogits) {
  PAGELLM_REQUIRE_CUDA();
  cuda::CudaBackend& cb = as_cuda(cuda);
  uint64_t seed = base_seed() + 9700;
  for (int64_t n : {1, 7, 64, 300}) {
    Rng rng(++seed);
    RoutedStep r(cuda, rng, n);
    const ExpertsCase& c = r.c;
    DevBuf out(cuda, n * c.D * 2);
    Tensor out_t = out.view(DType::kBF16, {n, c.D});
    const MoeExpertWeights w = device_weights(c, r.in);
    auto step = [&](MoePath path) {
      cuda.moe_route(r.logits_t, Tensor(), r.p, r.ids_t, r.w_t);
      cb.moe_experts_on_path(r.h_t, r.ids_t, r.w_t, w, r.shared_t, out_t, path);
    };
    step(MoePath::kAuto);  // sizes the workspace
    std::unique_ptr<OpGraph> graph = cuda.capture([&] { step(MoePath::kAuto); });
    const std::string what = Label("moe route+experts graph", seed)("n", n);
    ASSERT_NE(graph, nullptr) << what << ": routing and experts could not be recorded";
    r.new_logits(rng);
    step(MoePath::kAuto);
    std::vector<float> direct = download_bf16(out);
    clear_bf16(out, n, c.D);
    graph->replay();
    std::vector<float> replayed = download_bf16(out);
    EXPECT_TRUE(compare(what + " replay vs direct", replayed, direct, kExact));
    // And the direct run is right: against the CPU on the CPU's routing of the new logits.
    std::vector<int32_t> host_ids(n * c.K);
    std::vector<float> host_w(n * c.K);
    Tensor hi(host_ids.data(), DType::kI32, {n, c.K});
    Tensor hw = host_f32(host_w, {n, c.K});
    cpu.moe_route(host_f32(r.logits, {n, c.E}), Tensor(), r.p, hi, hw);
    r.in.ids = host_ids;
    r.in.weights = host_w;
    std::vector<float> want, slack;
    reference(cpu, c, r.in, want, slack);
    direct.resize(n * c.D);
    EXPECT_TRUE(compare(what + " direct vs cpu", direct, want, kBf16Tol, &slack));
    EXPECT_TRUE(guards_ok(what, out));
  }
}

// moe_order then moe_experts_ordered, the order made in a side branch (as DeepSeek makes it: the
// join, captured into a graph, is a programmatic edge, which an experts' kernel reading the order
// before its wait once raced) or on the main line: bit for bit what moe_experts gives on the same
// ids, run directly and replayed from a graph on new logits. 300 tokens take the grouped GEMMs,
// the others the GEMVs.
TEST(MoeExperts, OrderMadeAheadMatchesMoeExperts) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;  // the reference is moe_experts, which the tests above hold to the CPU
  uint64_t seed = base_seed() + 9800;
  for (int64_t n : {1, 7, 64, 300}) {
    Rng rng(++seed);
    RoutedStep r(cuda, rng, n);
    const ExpertsCase& c = r.c;
    const int64_t order_bytes = cuda.moe_order_bytes(n * c.K, c.E);
    ASSERT_GT(order_bytes, 0);
    DevBuf order(cuda, order_bytes), plain(cuda, n * c.D * 2), ordered(cuda, n * c.D * 2);
    Tensor order_t = order.view(DType::kI32, {order_bytes / 4});
    Tensor plain_t = plain.view(DType::kBF16, {n, c.D});
    Tensor ordered_t = ordered.view(DType::kBF16, {n, c.D});
    const MoeExpertWeights w = device_weights(c, r.in);
    auto step = [&](bool in_branch) {
      if (in_branch) cuda.begin_side();
      cuda.moe_route(r.logits_t, Tensor(), r.p, r.ids_t, r.w_t);
      cuda.moe_order(r.ids_t, c.E, order_t);
      if (in_branch) {
        cuda.end_side();
        cuda.join_side();
      }
      cuda.moe_experts_ordered(r.h_t, r.ids_t, r.w_t, order_t, w, r.shared_t, ordered_t);
      cuda.moe_experts(r.h_t, r.ids_t, r.w_t, w, r.shared_t, plain_t);
    };
    for (bool in_branch : {true, false}) {
      const std::string what =
          Label("moe_order + moe_experts_ordered", seed)("n", n)("side branch", in_branch);
      step(in_branch);
      EXPECT_TRUE(compare(what, download_bf16(ordered), download_bf16(plain), kExact));
      EXPECT_TRUE(guards_ok(what, ordered));
    }
    std::unique_ptr<OpGraph> graph = cuda.capture([&] { step(true); });
    const std::string what = Label("moe_order graph", seed)("n", n);
    ASSERT_NE(graph, nullptr) << what << ": the ordered experts could not be recorded";
    r.new_logits(rng);
    clear_bf16(ordered, n, c.D);
    graph->replay();
    EXPECT_TRUE(compare(what + " replay vs moe_experts", download_bf16(ordered),
                        download_bf16(plain), kExact));
    EXPECT_TRUE(guards_ok(what, ordered));
  }
}

}  // namespace
}  // namespace pagellm::optest
