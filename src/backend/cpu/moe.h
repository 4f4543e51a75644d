// The CPU backend's mixture-of-experts ops (Backend::moe_route, Backend::moe_experts): the
// reference the CUDA kernels are tested against, and what the CPU golden tests run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace pagellm::cpu {

// Routes one token as transformers does: scores in f32 (softmax with a double-precision sum, or
// sigmoid), the top_k by p.select with ties going to the lower expert index, the chosen raw scores
// as weights, renormalized (DeepSeek-V3 guards the division with 1e-20) and scaled.
//   logits [E]; bias [E] (kNoauxTc) or null; ids, weights [p.top_k]
void moe_route_token(const float* logits, int64_t n_experts, const float* bias,
                     const MoeRouteParams& p, int32_t* ids, float* weights);

// The routed experts over a backend's own ops (gather_rows, matmul, silu_mul): per expert, its
// tokens' rows are gathered and its three matmuls run once on them; each token's outputs are
// then added in ascending expert order into an f32 accumulator, and the shared experts' output
// last. Scratch grows with the step and is reused.
class MoeExpertsRunner {
 public:
  void run(Backend& backend, const Tensor& h, const Tensor& ids, const Tensor& weights,
           const MoeExpertWeights& experts, const Tensor& shared, Tensor& out);

 private:
  void reserve(Backend& backend, int64_t n_rows, int64_t n_tokens, int64_t hidden, int64_t inter);

  std::unique_ptr<Buffer> buf_;
  int64_t cap_rows_ = 0, cap_tokens_ = 0, hidden_ = 0, inter_ = 0;
  Tensor rows_, x_, gate_, up_, act_, y_, acc_;  // [cap], [cap, D], [cap, F] x3, [cap, D], [n, D]
  std::vector<std::vector<int32_t>> tokens_of_;  // per expert: its tokens, ascending
  std::vector<std::vector<float>> weight_of_;    // per expert: their weights
};

}  // namespace pagellm::cpu
