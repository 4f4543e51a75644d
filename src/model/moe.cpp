#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace pagellm {
namespace {

// Indices of the k largest values (ties: the lower index first), in descending order of value.
void top_k(const float* v, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  idx.resize(k);
}

}  // namespace

void route_tokens(const ModelConfig& cfg, const float* logits, const float* correction_bias,
                  int64_t n, MoeRouting& out) {
  const int64_t E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  const int64_t G = cfg.n_group, per_group = E / std::max<int64_t>(G, 1);
  PAGELLM_CHECK(cfg.topk_method != MoeTopk::kNoauxTc || correction_bias != nullptr);
  out.n_tokens = n;
  out.top_k = K;
  out.experts.resize(n * K);
  out.weights.resize(n * K);
  std::vector<float> scores(E), choice(E), group_scores(G);
  std::vector<int32_t> idx, groups, in_group;
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    if (cfg.scoring_func == MoeScoring::kSoftmax) {
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
    int32_t* chosen = out.experts.data() + t * K;
    float* w = out.weights.data() + t * K;
    switch (cfg.topk_method) {
      case MoeTopk::kGreedy:
        top_k(scores.data(), E, K, idx);
        break;
      case MoeTopk::kGroupLimitedGreedy: {
        for (int64_t g = 0; g < G; ++g)
          group_scores[g] = *std::max_element(&scores[g * per_group], &scores[(g + 1) * per_group]);
        top_k(group_scores.data(), G, cfg.topk_group, groups);
        // Experts of the other groups score 0 (transformers' masked_fill), not -inf.
        choice.assign(E, 0.0f);
        for (int32_t g : groups)
          std::copy(&scores[g * per_group], &scores[(g + 1) * per_group], &choice[g * per_group]);
        top_k(choice.data(), E, K, idx);
        break;
      }
      case MoeTopk::kNoauxTc: {
        for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + correction_bias[e];
        for (int64_t g = 0; g < G; ++g) {
          top_k(&choice[g * per_group], per_group, 2, in_group);
          group_scores[g] = choice[g * per_group + in_group[0]] + choice[g * per_group + in_group[1]];
        }
        top_k(group_scores.data(), G, cfg.topk_group, groups);
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
    if (cfg.norm_topk_prob) {
      // DeepSeek-V3 guards the division with 1e-20; Mixtral's softmax weights are never all 0.
      const float denom = cfg.topk_method == MoeTopk::kNoauxTc ? sum + 1e-20f : sum;
      for (int64_t k = 0; k < K; ++k) w[k] /= denom;
    }
    if (cfg.routed_scaling_factor != 1.0) {
      for (int64_t k = 0; k < K; ++k) w[k] *= static_cast<float>(cfg.routed_scaling_factor);
    }
  }
}

void run_swiglu(Backend& backend, const MoeExpert& mlp, const Tensor& h, Tensor& gate, Tensor& up,
                Tensor& act, Tensor& out) {
  backend.matmul(h, mlp.gate_proj, Tensor(), gate);
  backend.matmul(h, mlp.up_proj, Tensor(), up);
  backend.silu_mul(gate, up, act);
  backend.matmul(act, mlp.down_proj, Tensor(), out);
}

void MoeExperts::reserve(int64_t n) {
  if (n <= capacity_) return;
  const int64_t cap = std::max<int64_t>(n, 16);
  const DType dt = backend_.activation_dtype();
  PAGELLM_CHECK_MSG(dt == DType::kF32 && backend_.device() == Device::kCpu,
                    "MoE experts run on the CPU backend only");
  buf_ = backend_.allocate(cap * 4 + dtype_bytes(dt, cap * (2 * hidden_ + 3 * inter_)) + 64 * 6);
  char* p = static_cast<char*>(buf_->data());
  auto take = [&](DType t, int64_t cols) {
    Tensor x(p, t, {cap, cols}, backend_.device());
    p += (dtype_bytes(t, cap * cols) + 63) / 64 * 64;
    return x;
  };
  rows_ = take(DType::kI32, 1).reshape({cap});
  x_ = take(dt, hidden_), gate_ = take(dt, inter_), up_ = take(dt, inter_), act_ = take(dt, inter_);
  y_ = take(dt, hidden_);
  capacity_ = cap;
}

void MoeExperts::run(const Tensor& h, const MoeRouting& routing,
                     const std::vector<MoeExpert>& experts, Tensor& out) {
  const int64_t n = routing.n_tokens, K = routing.top_k, D = hidden_;
  PAGELLM_CHECK(h.rows() == n && out.rows() == n && h.cols() == D && out.cols() == D);
  reserve(n);
  tokens_of_.resize(experts.size());
  weight_of_.resize(experts.size());
  for (auto& v : tokens_of_) v.clear();
  for (auto& v : weight_of_) v.clear();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = routing.experts[t * K + k];
      PAGELLM_CHECK(e >= 0 && e < static_cast<int32_t>(experts.size()));
      tokens_of_[e].push_back(static_cast<int32_t>(t));
      weight_of_[e].push_back(routing.weights[t * K + k]);
    }
  }
  for (int64_t t = 0; t < n; ++t) std::memset(out.row_ptr(t), 0, D * sizeof(float));
  for (size_t e = 0; e < experts.size(); ++e) {
    const std::vector<int32_t>& toks = tokens_of_[e];
    const int64_t m = static_cast<int64_t>(toks.size());
    if (m == 0) continue;
    Tensor rows = rows_.slice_rows(0, m);
    backend_.copy_from_host(rows.data, toks.data(), m * sizeof(int32_t));
    Tensor x = x_.slice_rows(0, m), gate = gate_.slice_rows(0, m), up = up_.slice_rows(0, m);
    Tensor act = act_.slice_rows(0, m), y = y_.slice_rows(0, m);
    backend_.gather_rows(h, rows, x);                        // [m, D]
    run_swiglu(backend_, experts[e], x, gate, up, act, y);   // [m, D]
    for (int64_t i = 0; i < m; ++i) {
      const float wgt = weight_of_[e][i];
      const float* yr = static_cast<const float*>(y.row_ptr(i));
      float* o = static_cast<float*>(out.row_ptr(toks[i]));
      for (int64_t d = 0; d < D; ++d) o[d] += yr[d] * wgt;
    }
  }
}

}  // namespace pagellm
