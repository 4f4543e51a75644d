#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/cpu/reference.h"
#include "core/check.h"

namespace pagellm::cpu {
namespace {

// Indices of the k largest values (ties: the lower index first), in descending order of value.
void top_k(const float* v, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(k);
}

// Expert e's matrices as [rows, cols] views: of the stack when there is one, else its own.
Tensor expert_gate(const MoeExpertWeights& w, int64_t e) {
  if (!w.stacked()) return w.gate[e];
  const int64_t F = w.inter(), D = w.hidden();
  return Tensor(static_cast<char*>(w.gate_up.data) + dtype_bytes(w.gate_up.dtype, e * 2 * F * D),
                w.gate_up.dtype, {F, D}, w.gate_up.device);
}
Tensor expert_up(const MoeExpertWeights& w, int64_t e) {
  if (!w.stacked()) return w.up[e];
  const int64_t F = w.inter(), D = w.hidden();
  return Tensor(
      static_cast<char*>(w.gate_up.data) + dtype_bytes(w.gate_up.dtype, (e * 2 * F + F) * D),
      w.gate_up.dtype, {F, D}, w.gate_up.device);
}
Tensor expert_down(const MoeExpertWeights& w, int64_t e) {
  if (!w.stacked()) return w.down_each[e];
  const int64_t F = w.inter(), D = w.hidden();
  return Tensor(static_cast<char*>(w.down.data) + dtype_bytes(w.down.dtype, e * D * F),
                w.down.dtype, {D, F}, w.down.device);
}

}  // namespace

void moe_route_token(const float* l, int64_t n_experts, const float* bias, const MoeRouteParams& p,
                     int32_t* chosen, float* w) {
  const int64_t E = n_experts, K = p.top_k;
  const int64_t G = std::max<int64_t>(p.n_group, 1), per_group = E / G;
  std::vector<float> scores(E), choice(E), group_scores(G);
  std::vector<int32_t> idx, groups, in_group;
  if (p.scoring == MoeScoreFunc::kSoftmax) {
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < E; ++e)
      scores[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
  } else {
    for (int64_t e = 0; e < E; ++e)
      scores[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
  }
  switch (p.select) {
    case MoeSelect::kGreedy:
      top_k(scores.data(), E, K, idx);
      break;
    case MoeSelect::kGroupLimitedGreedy: {
      for (int64_t g = 0; g < G; ++g)
        group_scores[g] = *std::max_element(&scores[g * per_group], &scores[(g + 1) * per_group]);
      top_k(group_scores.data(), G, p.topk_group, groups);
      // Experts of the other groups score 0 (transformers' masked_fill), not -inf.
      choice.assign(E, 0.0f);
      for (int32_t g : groups)
        std::copy(&scores[g * per_group], &scores[(g + 1) * per_group], &choice[g * per_group]);
      top_k(choice.data(), E, K, idx);
      break;
    }
    case MoeSelect::kNoauxTc: {
      for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + bias[e];
      for (int64_t g = 0; g < G; ++g) {
        top_k(&choice[g * per_group], per_group, 2, in_group);
        group_scores[g] = choice[g * per_group + in_group[0]] + choice[g * per_group + in_group[1]];
      }
      top_k(group_scores.data(), G, p.topk_group, groups);
      std::vector<float> masked(E, -std::numeric_limits<float>::infinity());
      for (int32_t g : groups)
        std::copy(&choice[g * per_group], &choice[(g + 1) * per_group], &masked[g * per_group]);
      top_k(masked.data(), E, K, idx);
      break;
    }
  }
  float sum = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    chosen[k] = idx[k];
    w[k] = scores[idx[k]];
    sum += w[k];
  }
  if (p.norm_topk_prob) {
    // DeepSeek-V3 guards the division with 1e-20; Mixtral's softmax weights are never all 0.
    const float denom = p.select == MoeSelect::kNoauxTc ? sum + 1e-20f : sum;
    for (int64_t k = 0; k < K; ++k) w[k] /= denom;
  }
  if (p.routed_scaling_factor != 1.0f) {
    for (int64_t k = 0; k < K; ++k) w[k] *= p.routed_scaling_factor;
  }
}

void MoeExpertsRunner::reserve(Backend& backend, int64_t n_rows, int64_t n_tokens, int64_t hidden,
                               int64_t inter) {
  if (n_rows <= cap_rows_ && n_tokens <= cap_tokens_ && hidden == hidden_ && inter == inter_)
    return;
  const int64_t cap = std::max({n_rows, cap_rows_, int64_t{16}});
  const int64_t cap_t = std::max({n_tokens, cap_tokens_, int64_t{16}});
  // 64-byte aligned slots, as the backend's scratch allocations are (the SIMD kernels' vectors).
  auto padded = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const int64_t bytes = padded(cap * 4) + 2 * padded(cap * hidden * 4) +
                        3 * padded(cap * inter * 4) + padded(cap_t * hidden * 4);
  buf_ = backend.must_allocate(bytes, "the experts' scratch");
  char* p = static_cast<char*>(buf_->data());
  auto take = [&](DType t, int64_t rows, int64_t cols) {
    Tensor x(p, t, {rows, cols}, Device::kCpu);
    p += padded(dtype_bytes(t, rows * cols));
    return x;
  };
  rows_ = take(DType::kI32, cap, 1).reshape({cap});
  x_ = take(DType::kF32, cap, hidden);
  gate_ = take(DType::kF32, cap, inter);
  up_ = take(DType::kF32, cap, inter);
  act_ = take(DType::kF32, cap, inter);
  y_ = take(DType::kF32, cap, hidden);
  acc_ = take(DType::kF32, cap_t, hidden);
  cap_rows_ = cap;
  cap_tokens_ = cap_t;
  hidden_ = hidden;
  inter_ = inter;
}

void MoeExpertsRunner::run(Backend& backend, const Tensor& h, const Tensor& ids,
                           const Tensor& weights, const MoeExpertWeights& experts,
                           const Tensor& shared, Tensor& out) {
  const int64_t n = h.rows(), D = h.cols(), E = experts.n_experts(), F = experts.inter();
  const int64_t K = ids.cols();
  const int32_t* id = ids.ptr<int32_t>();
  const float* wt = weights.ptr<float>();
  tokens_of_.resize(E);
  weight_of_.resize(E);
  for (auto& v : tokens_of_) v.clear();
  for (auto& v : weight_of_) v.clear();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = id[t * K + k];
      PAGELLM_CHECK_MSG(e >= 0 && e < E, "moe_experts: expert id out of range");
      tokens_of_[e].push_back(static_cast<int32_t>(t));
      weight_of_[e].push_back(wt[t * K + k]);
    }
  }
  int64_t max_rows = 0;
  for (const auto& v : tokens_of_) max_rows = std::max<int64_t>(max_rows, v.size());
  reserve(backend, max_rows, n, D, F);
  Tensor acc = acc_.slice_rows(0, n);  // f32 [n, D]
  std::memset(acc.data, 0, static_cast<size_t>(n * D) * sizeof(float));
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& toks = tokens_of_[e];
    const int64_t m = static_cast<int64_t>(toks.size());
    if (m == 0) continue;
    Tensor rows = rows_.slice_rows(0, m);
    std::memcpy(rows.data, toks.data(), m * sizeof(int32_t));
    Tensor x = x_.slice_rows(0, m), gate = gate_.slice_rows(0, m), up = up_.slice_rows(0, m);
    Tensor act = act_.slice_rows(0, m), y = y_.slice_rows(0, m);
    backend.gather_rows(h, rows, x);                             // [m, D]
    backend.matmul(x, expert_gate(experts, e), Tensor(), gate);  // [m, F]
    backend.matmul(x, expert_up(experts, e), Tensor(), up);      // [m, F]
    backend.silu_mul(gate, up, act);                             // [m, F]
    backend.matmul(act, expert_down(experts, e), Tensor(), y);   // [m, D]
    for (int64_t i = 0; i < m; ++i) {
      const float wgt = weight_of_[e][i];
      const float* yr = y.ptr<float>() + i * D;
      float* o = acc.ptr<float>() + toks[i] * D;
      for (int64_t d = 0; d < D; ++d) o[d] += yr[d] * wgt;
    }
  }
  // The routed sum is complete before the shared experts' output joins it (transformers adds
  // the two tensors), and before `out` is written, which may be `shared` itself.
  for (int64_t t = 0; t < n; ++t) {
    const float* a = acc.ptr<float>() + t * D;
    float* o = row_f32(out, t);
    if (shared.defined()) {
      const float* s = row_f32(shared, t);
      for (int64_t d = 0; d < D; ++d) o[d] = a[d] + s[d];
    } else {
      std::memcpy(o, a, static_cast<size_t>(D) * sizeof(float));
    }
  }
}

}  // namespace pagellm::cpu
