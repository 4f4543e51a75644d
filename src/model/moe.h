// Mixture-of-experts pieces shared by DeepSeek-V2/V3 and Mixtral: the router (scores, top-k by
// each topk_method, weights exactly as transformers computes them) and the routed experts run over
// the tokens each expert received, one matmul per expert per step. CPU backend only for now: the
// routing and the weighted combine run on the host, reading and writing activations in place.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"

namespace pagellm {

// One SwiGLU expert (or the shared experts as one wide MLP): down(silu(gate x) * up x).
struct MoeExpert {
  Tensor gate_proj, up_proj;  // [F, D]
  Tensor down_proj;           // [D, F]
};

// The experts and weights chosen for each token of a step.
struct MoeRouting {
  int64_t n_tokens = 0;
  int64_t top_k = 0;
  std::vector<int32_t> experts;  // [n_tokens, top_k]
  std::vector<float> weights;    // [n_tokens, top_k], routed_scaling_factor applied
};

// Routes n tokens from their router logits (f32 [n, E], row-major). `correction_bias` ([E]) is
// DeepSeek-V3's e_score_correction_bias (noaux_tc only; nullptr otherwise). Follows transformers:
//   softmax | sigmoid scores in f32; greedy: top-k scores; group_limited_greedy: top-k among the
//   topk_group groups with the highest max score; noaux_tc: groups ranked by the sum of their
//   top-2 (score + bias), experts by score + bias, weights = the raw scores of the chosen;
//   then optional renormalization (norm_topk_prob) and routed_scaling_factor.
void route_tokens(const ModelConfig& cfg, const float* logits, const float* correction_bias,
                  int64_t n, MoeRouting& out);

// Runs routed experts. Tokens are grouped per expert so each expert's three matmuls run once per
// step on the gathered rows; results are combined in ascending expert order (as transformers'
// index_add loop), so the sum is formed in the same order.
class MoeExperts {
 public:
  MoeExperts(Backend& backend, int64_t hidden, int64_t intermediate)
      : backend_(backend), hidden_(hidden), inter_(intermediate) {}

  // out[t] = sum over the token's experts of weight * expert(h[t]).   h, out act [n, D] (CPU)
  void run(const Tensor& h, const MoeRouting& routing, const std::vector<MoeExpert>& experts,
           Tensor& out);

 private:
  void reserve(int64_t n);

  Backend& backend_;
  int64_t hidden_, inter_;
  int64_t capacity_ = 0;
  std::unique_ptr<Buffer> buf_;
  Tensor rows_, x_, gate_, up_, act_, y_;  // [cap], [cap, D], [cap, F] x3, [cap, D]
  std::vector<std::vector<int32_t>> tokens_of_;  // per expert: token rows
  std::vector<std::vector<float>> weight_of_;    // per expert: their weights
};

// Runs a dense SwiGLU MLP: out = down(silu(gate h) * up h).   gate, up, act: [n, F] scratch
void run_swiglu(Backend& backend, const MoeExpert& mlp, const Tensor& h, Tensor& gate, Tensor& up,
                Tensor& act, Tensor& out);

}  // namespace pagellm
