// The CPU backend's mixture-of-experts ops: moe_route on hand-computed cases of every scoring
// function and top-k method (the reference the CUDA kernel is tested against), and moe_experts
// against a naive double-precision evaluation, against the per-expert composition of the
// backend's own ops it replaced (bit for bit), on stacked and per-expert weights alike, with
// experts that get no tokens, one expert that gets them all, and out written over shared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace pagellm::testing {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(Backend& be, std::vector<float> logits, int64_t n, int64_t E, const MoeRouteParams& p,
             std::vector<float> bias = {}) {
  Routed r;
  r.ids.assign(n * p.top_k, -7);
  r.weights.assign(n * p.top_k, kSentinel);
  Tensor ids(r.ids.data(), DType::kI32, {n, p.top_k});
  Tensor w(r.weights.data(), DType::kF32, {n, p.top_k});
  Tensor b = bias.empty() ? Tensor() : Tensor(bias.data(), DType::kF32, {E});
  be.moe_route(Tensor(logits.data(), DType::kF32, {n, E}), b, p, ids, w);
  return r;
}

MoeRouteParams params(int32_t top_k, MoeSelect select, MoeScoreFunc scoring) {
  MoeRouteParams p;
  p.top_k = top_k;
  p.select = select;
  p.scoring = scoring;
  return p;
}

// Weights are f32 computations of the exact values below: within a few ulp.
constexpr double kWeightTol = 1e-6;

TEST(CpuMoeRoute, MixtralSoftmaxTopKRenormalized) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    MoeRouteParams p = params(2, MoeSelect::kGreedy, MoeScoreFunc::kSoftmax);
    p.norm_topk_prob = true;
    const Routed r = route(*be, {0, 1, 2, 3, /* token 2 */ 3, -1, 0, 2.5f}, 2, 4, p);
    EXPECT_EQ(r.ids[0], 3) << isa;
    EXPECT_EQ(r.ids[1], 2) << isa;
    const double a = std::exp(3.0), b = std::exp(2.0);
    EXPECT_NEAR(r.weights[0], a / (a + b), kWeightTol) << isa;
    EXPECT_NEAR(r.weights[1], b / (a + b), kWeightTol) << isa;
    EXPECT_EQ(r.ids[2], 0) << isa;
    EXPECT_EQ(r.ids[3], 3) << isa;
    EXPECT_NEAR(r.weights[2], std::exp(0.5) / (std::exp(0.5) + 1.0), kWeightTol) << isa;
    EXPECT_NEAR(r.weights[2] + r.weights[3], 1.0, kWeightTol) << isa;
    checked += 8;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeRoute, DeepSeekV2GreedyKeepsSoftmaxMassAndScales) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    MoeRouteParams p = params(2, MoeSelect::kGreedy, MoeScoreFunc::kSoftmax);
    p.routed_scaling_factor = 1.5f;
    const std::vector<float> logits = {0, 1, 2, 3};
    const Routed r = route(*be, logits, 1, 4, p);
    double z = 0;
    for (float l : logits) z += std::exp(double{l});
    EXPECT_EQ(r.ids[0], 3) << isa;
    EXPECT_EQ(r.ids[1], 2) << isa;
    EXPECT_NEAR(r.weights[0], 1.5 * std::exp(3.0) / z, kWeightTol) << isa;  // not renormalized
    EXPECT_NEAR(r.weights[1], 1.5 * std::exp(2.0) / z, kWeightTol) << isa;
    checked += 4;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeRoute, TiesGoToTheLowerExpert) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    // Experts 1, 2 and 4 tie for the top; 0 and 3 tie below them.
    const Routed r = route(*be, {0.5f, 2, 2, 0.5f, 2}, 1, 5,
                           params(4, MoeSelect::kGreedy, MoeScoreFunc::kSoftmax));
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4, 0})) << isa;
    EXPECT_EQ(r.weights[0], r.weights[1]) << isa;
    EXPECT_EQ(r.weights[1], r.weights[2]) << isa;
    checked += 3;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeRoute, SigmoidGreedyWeightsAreRawScores) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    const Routed r =
        route(*be, {-1, 2, 0, 1}, 1, 4, params(2, MoeSelect::kGreedy, MoeScoreFunc::kSigmoid));
    EXPECT_EQ(r.ids[0], 1) << isa;
    EXPECT_EQ(r.ids[1], 3) << isa;
    EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-2.0)), kWeightTol) << isa;
    EXPECT_NEAR(r.weights[1], 1.0 / (1.0 + std::exp(-1.0)), kWeightTol) << isa;
    checked += 4;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeRoute, GroupLimitedGreedyPicksWithinTheBestGroups) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    // Groups of 2: g0 {5, 0} max 5, g1 {4, 4} max 4, g2 {0, 0} max 0, g3 {4.5, 0} max 4.5.
    // Keeping 2 groups (g0, g3), the top 3 are experts 0, 6 and then 1 (logit 0, in a kept
    // group) rather than 2 (logit 4, in a dropped group).
    MoeRouteParams p = params(3, MoeSelect::kGroupLimitedGreedy, MoeScoreFunc::kSoftmax);
    p.n_group = 4;
    p.topk_group = 2;
    const std::vector<float> logits = {5, 0, 4, 4, 0, 0, 4.5f, 0};
    Routed r = route(*be, logits, 1, 8, p);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 6, 1})) << isa;
    double z = 0;
    for (float l : logits) z += std::exp(double{l});
    EXPECT_NEAR(r.weights[2], 1.0 / z, kWeightTol) << isa;  // the kept group's 0-logit expert
    p.select = MoeSelect::kGreedy;
    r = route(*be, logits, 1, 8, p);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 6, 2})) << isa;  // without groups, expert 2 is third
    // More experts than the kept groups hold: the rest come from dropped groups, which rank as 0.
    p = params(5, MoeSelect::kGroupLimitedGreedy, MoeScoreFunc::kSoftmax);
    p.n_group = 4;
    p.topk_group = 2;
    r = route(*be, logits, 1, 8, p);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 6, 1, 7, 2})) << isa;
    // Its weight is still its raw score (selection ranked it as 0).
    EXPECT_NEAR(r.weights[4], std::exp(4.0) / z, kWeightTol) << isa;
    checked += 5;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeRoute, NoauxTcRanksGroupsByTopTwoOfBiasedScores) {
  int64_t checked = 0;
  for (auto& [isa, be] : all_backends()) {
    // All sigmoid scores are 0.5. Biased: g0 {0.8, 0.0} (top-2 sum 0.8, max 0.8), g1 {0.7, 0.7}
    // (sum 1.4): g1 wins although expert 0 has the best biased score. The weight is the raw score.
    MoeRouteParams p = params(1, MoeSelect::kNoauxTc, MoeScoreFunc::kSigmoid);
    p.n_group = 2;
    p.topk_group = 1;
    p.routed_scaling_factor = 2.5f;
    const std::vector<float> bias = {0.3f, -0.5f, 0.2f, 0.2f};
    Routed r = route(*be, {0, 0, 0, 0}, 1, 4, p, bias);
    EXPECT_EQ(r.ids[0], 2) << isa;
    EXPECT_NEAR(r.weights[0], 0.5 * 2.5, kWeightTol) << isa;
    p.norm_topk_prob = true;
    r = route(*be, {0, 0, 0, 0}, 1, 4, p, bias);
    EXPECT_NEAR(r.weights[0], 1.0 * 2.5, kWeightTol) << isa;
    // Two experts, renormalized: both of g1, each half of the mass, then scaled.
    p.top_k = 2;
    r = route(*be, {0, 0, 0, 0}, 1, 4, p, bias);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3})) << isa;
    EXPECT_NEAR(r.weights[0], 0.5 * 2.5, kWeightTol) << isa;
    EXPECT_NEAR(r.weights[1], 0.5 * 2.5, kWeightTol) << isa;
    checked += 6;
  }
  EXPECT_GT(checked, 0);
}

// --- moe_experts ---

struct ExpertsCase {
  int64_t n, E, K, D, F;
  bool shared;
  DType wtype;
  int routing;  // 0: random distinct experts; 1: every token on experts 0..K-1; 2: odd experts only
};

struct ExpertsData {
  std::vector<float> h, weights, shared;
  std::vector<int32_t> ids;
  std::vector<float> gu, dn;  // f32 values, already rounded to wtype: [E, 2F, D], [E, D, F]
  std::vector<uint16_t> gu16, dn16;
};

ExpertsData make_data(const ExpertsCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  ExpertsData d;
  d.h = random_floats(rng, c.n * c.D);
  d.shared = random_floats(rng, c.n * c.D);
  const float a = 1.0f / std::sqrt(static_cast<float>(c.D));
  const float b = 1.0f / std::sqrt(static_cast<float>(c.F));
  d.gu = random_floats(rng, c.E * 2 * c.F * c.D, -a, a);
  d.dn = random_floats(rng, c.E * c.D * c.F, -b, b);
  if (c.wtype == DType::kBF16) {
    for (auto* v : {&d.gu, &d.dn})
      for (float& x : *v) x = bf16_to_f32(f32_to_bf16(x));
    for (float x : d.gu) d.gu16.push_back(f32_to_bf16(x));
    for (float x : d.dn) d.dn16.push_back(f32_to_bf16(x));
  }
  d.ids.resize(c.n * c.K);
  d.weights = random_floats(rng, c.n * c.K, 0.05f, 1.0f);
  std::vector<int32_t> perm(c.E);
  for (int64_t t = 0; t < c.n; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    if (c.routing == 0) std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < c.K; ++k) {
      int32_t e = perm[k];
      if (c.routing == 2) e = static_cast<int32_t>((2 * k + 1 + 2 * t) % c.E) | 1;
      d.ids[t * c.K + k] = e;
    }
    // Routing order is best first, not expert order: the op must sort.
    if (c.routing != 0) std::reverse(d.ids.begin() + t * c.K, d.ids.begin() + (t + 1) * c.K);
  }
  return d;
}

// out[t] = sum over its experts, ascending, of w * down(silu(gate h) * up h) (+ shared), in double.
std::vector<double> naive_experts(const ExpertsCase& c, const ExpertsData& d) {
  std::vector<double> out(c.n * c.D, 0.0);
  std::vector<double> act(c.F);
  for (int64_t t = 0; t < c.n; ++t) {
    std::vector<std::pair<int32_t, float>> es;
    for (int64_t k = 0; k < c.K; ++k) es.push_back({d.ids[t * c.K + k], d.weights[t * c.K + k]});
    std::stable_sort(es.begin(), es.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto [e, w] : es) {
      for (int64_t f = 0; f < c.F; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < c.D; ++i) {
          g += double(d.gu[(e * 2 * c.F + f) * c.D + i]) * d.h[t * c.D + i];
          u += double(d.gu[(e * 2 * c.F + c.F + f) * c.D + i]) * d.h[t * c.D + i];
        }
        act[f] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t i = 0; i < c.D; ++i) {
        double y = 0;
        for (int64_t f = 0; f < c.F; ++f) y += double(d.dn[(e * c.D + i) * c.F + f]) * act[f];
        out[t * c.D + i] += w * y;
      }
    }
    if (c.shared)
      for (int64_t i = 0; i < c.D; ++i) out[t * c.D + i] += d.shared[t * c.D + i];
  }
  return out;
}

// The weights as the op takes them: stacked, or per-expert views of the same memory (as the CPU
// keeps a checkpoint's matrices, each its own tensor).
MoeExpertWeights weights_of(const ExpertsCase& c, ExpertsData& d, bool stacked) {
  void* gu = c.wtype == DType::kBF16 ? static_cast<void*>(d.gu16.data()) : d.gu.data();
  void* dn = c.wtype == DType::kBF16 ? static_cast<void*>(d.dn16.data()) : d.dn.data();
  MoeExpertWeights w;
  if (stacked) {
    w.gate_up = Tensor(gu, c.wtype, {c.E, 2 * c.F, c.D});
    w.down = Tensor(dn, c.wtype, {c.E, c.D, c.F});
    return w;
  }
  const int64_t es = dtype_bytes(c.wtype, 1);
  for (int64_t e = 0; e < c.E; ++e) {
    char* g = static_cast<char*>(gu) + es * e * 2 * c.F * c.D;
    w.gate.push_back(Tensor(g, c.wtype, {c.F, c.D}));
    w.up.push_back(Tensor(g + es * c.F * c.D, c.wtype, {c.F, c.D}));
    w.down_each.push_back(Tensor(static_cast<char*>(dn) + es * e * c.D * c.F, c.wtype, {c.D, c.F}));
  }
  return w;
}

// What the model code did before the op existed: per expert, gather its tokens' rows, three
// matmuls and the SiLU through the backend's ops, then add weight * y into each token's row in
// ascending expert order, and the shared experts' output last.
std::vector<float> composed_experts(Backend& be, const ExpertsCase& c, ExpertsData& d) {
  const MoeExpertWeights w = weights_of(c, d, false);
  std::vector<float> acc(c.n * c.D, 0.0f);
  Tensor h(d.h.data(), DType::kF32, {c.n, c.D});
  for (int64_t e = 0; e < c.E; ++e) {
    std::vector<int32_t> toks;
    std::vector<float> wts;
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t k = 0; k < c.K; ++k)
        if (d.ids[t * c.K + k] == e)
          toks.push_back(static_cast<int32_t>(t)), wts.push_back(d.weights[t * c.K + k]);
    const int64_t m = static_cast<int64_t>(toks.size());
    if (m == 0) continue;
    std::vector<float> x(m * c.D), gate(m * c.F), up(m * c.F), act(m * c.F), y(m * c.D);
    Tensor xt(x.data(), DType::kF32, {m, c.D}), gt(gate.data(), DType::kF32, {m, c.F});
    Tensor ut(up.data(), DType::kF32, {m, c.F}), at(act.data(), DType::kF32, {m, c.F});
    Tensor yt(y.data(), DType::kF32, {m, c.D});
    be.gather_rows(h, Tensor(toks.data(), DType::kI32, {m}), xt);
    be.matmul(xt, w.gate[e], Tensor(), gt);
    be.matmul(xt, w.up[e], Tensor(), ut);
    be.silu_mul(gt, ut, at);
    be.matmul(at, w.down_each[e], Tensor(), yt);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c.D; ++j) acc[toks[i] * c.D + j] += y[i * c.D + j] * wts[i];
  }
  if (c.shared)
    for (int64_t i = 0; i < c.n * c.D; ++i) acc[i] = acc[i] + d.shared[i];
  return acc;
}

// |got - want| <= 2e-5 (1 + |want|): f32 products of K = D and F terms of O(1) values round to
// ~1e-6 relative; a wrong expert, weight or missing shared term is off by O(0.1).
constexpr double kExpertsTol = 2e-5;

TEST(CpuMoeExperts, MatchNaiveAndTheComposedOpsBitForBit) {
  const std::vector<ExpertsCase> cases = {
      {1, 8, 2, 64, 48, false, DType::kF32, 0},  // Mixtral-like, batch 1
      {7, 8, 2, 64, 48, false, DType::kBF16, 0},
      {19, 16, 6, 32, 24, true, DType::kBF16, 0},  // DeepSeek-like: more experts, shared
      {13, 8, 3, 40, 16, true, DType::kF32, 1},    // every token on experts 0..2
      {9, 8, 2, 24, 8, true, DType::kF32, 2},      // even experts get no tokens
  };
  int64_t checked = 0;
  uint32_t seed = 4100;
  for (auto& [isa, be] : all_backends()) {
    for (const ExpertsCase& c : cases) {
      ExpertsData d = make_data(c, ++seed);
      const std::string ctx = isa + " n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) +
                              " K=" + std::to_string(c.K) + " D=" + std::to_string(c.D) +
                              " F=" + std::to_string(c.F) + (c.shared ? " +shared" : "") +
                              " routing=" + std::to_string(c.routing) +
                              " seed=" + std::to_string(seed);
      const std::vector<double> want = naive_experts(c, d);
      const std::vector<float> composed = composed_experts(*be, c, d);
      Tensor h(d.h.data(), DType::kF32, {c.n, c.D});
      Tensor ids(d.ids.data(), DType::kI32, {c.n, c.K});
      Tensor wts(d.weights.data(), DType::kF32, {c.n, c.K});
      for (bool stacked : {true, false}) {
        GuardedBuffer out(c.n * c.D);
        Tensor ot(out.ptr(), DType::kF32, {c.n, c.D});
        const Tensor shared =
            c.shared ? Tensor(d.shared.data(), DType::kF32, {c.n, c.D}) : Tensor();
        be->moe_experts(h, ids, wts, weights_of(c, d, stacked), shared, ot);
        ASSERT_TRUE(out.guard_intact()) << ctx;
        for (int64_t i = 0; i < c.n * c.D; ++i, checked += 2) {
          ASSERT_EQ(std::memcmp(&out.data[i], &composed[i], 4), 0)
              << ctx << (stacked ? " stacked" : " per-expert") << " index " << i << ": "
              << out.data[i] << " vs composed " << composed[i];
          PAGELLM_EXPECT_CLOSE(out.data[i], want[i], kExpertsTol * (1.0 + std::fabs(want[i])), ctx,
                               i);
        }
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeExperts, OutMayBeTheSharedBuffer) {
  auto be = make_cpu_backend();
  const ExpertsCase c{5, 8, 2, 32, 16, true, DType::kF32, 0};
  ExpertsData d = make_data(c, 4200);
  const std::vector<double> want = naive_experts(c, d);
  Tensor h(d.h.data(), DType::kF32, {c.n, c.D});
  Tensor ids(d.ids.data(), DType::kI32, {c.n, c.K});
  Tensor wts(d.weights.data(), DType::kF32, {c.n, c.K});
  std::vector<float> buf = d.shared;
  Tensor st(buf.data(), DType::kF32, {c.n, c.D});
  be->moe_experts(h, ids, wts, weights_of(c, d, true), st, st);
  int64_t checked = 0;
  for (int64_t i = 0; i < c.n * c.D; ++i, ++checked)
    PAGELLM_EXPECT_CLOSE(buf[i], want[i], kExpertsTol * (1.0 + std::fabs(want[i])), "aliased", i);
  EXPECT_GT(checked, 0);
}

TEST(CpuMoeExpertsDeathTest, ExpertIdOutOfRange) {
  auto be = make_cpu_backend();
  const ExpertsCase c{2, 4, 2, 8, 8, false, DType::kF32, 0};
  ExpertsData d = make_data(c, 4300);
  d.ids[3] = 4;
  std::vector<float> out(c.n * c.D);
  Tensor ot(out.data(), DType::kF32, {c.n, c.D});
  EXPECT_DEATH(be->moe_experts(Tensor(d.h.data(), DType::kF32, {c.n, c.D}),
                               Tensor(d.ids.data(), DType::kI32, {c.n, c.K}),
                               Tensor(d.weights.data(), DType::kF32, {c.n, c.K}),
                               weights_of(c, d, true), Tensor(), ot),
               "expert id out of range");
}

}  // namespace
}  // namespace pagellm::testing
