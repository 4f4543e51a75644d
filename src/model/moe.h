// Mixture-of-experts pieces shared by DeepSeek-V2/V3 and Mixtral: the config's routing as the
// backend's MoeRouteParams, the loading of a layer's routed experts (stacked on devices, as
// mapped on the CPU), and MoeBlock, which runs a layer's router and routed experts with the
// backend's moe_route and moe_experts ops. Nothing of a step leaves the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/weight_loader.h"

namespace pagellm {

// One SwiGLU MLP (a dense layer, or the shared experts as one wide MLP): down(silu(gate x) * up x).
// On devices gate and up are stacked by rows into one weight, so a step runs one GEMM (GEMV at
// decode) for both; the CPU keeps them apart, mapped from the checkpoint.
struct MoeExpert {
  Tensor gate_proj, up_proj;  // [F, D] (CPU)
  Tensor gate_up_proj;        // [2F, D]: gate | up (devices)
  Tensor down_proj;           // [D, F]
};

// Loads prefix + {gate,up,down}_proj.weight of an MLP with hidden size D and width F.
Status load_swiglu(WeightLoader& ld, Backend& backend, const std::string& prefix, int64_t D,
                   int64_t F, MoeExpert& out);

// Runs a SwiGLU MLP: out = down(silu(gate h) * up h).   gate_up: [n, 2F] scratch (any row
// stride), gate in columns [0, F) and up in [F, 2F); act: [n, F] scratch.
void run_swiglu(Backend& backend, const MoeExpert& mlp, const Tensor& h, Tensor& gate_up,
                Tensor& act, Tensor& out);

// The config's router (scoring_func, topk_method, groups, norm_topk_prob, routed_scaling_factor).
MoeRouteParams moe_route_params(const ModelConfig& cfg);

// Checkpoint names of expert e's three matrices, e.g. "model.layers.3.mlp.experts.7.gate_proj
// .weight" (DeepSeek) or "model.layers.3.block_sparse_moe.experts.7.w1.weight" (Mixtral).
struct ExpertNames {
  std::function<std::string(int64_t e)> gate, up, down;
};

// Loads a layer's E routed experts (hidden size D, intermediate size F). On devices they are
// stacked at load time, gate|up into [E, 2F, D] and down into [E, D, F], which the device's MoE
// kernels index by expert; on the CPU each expert keeps its own matrices, mapped from the
// checkpoint without a copy.
Status load_routed_experts(WeightLoader& ld, Backend& backend, int64_t E, int64_t D, int64_t F,
                           const ExpertNames& names, MoeExpertWeights& out);

// Bytes of one routed expert's three matrices as loaded.
int64_t expert_bytes(const MoeExpertWeights& w);

// A layer's router and routed experts over a step: router logits (f32, as transformers computes
// them), moe_route, then moe_experts, with the shared experts' output (when the model has them)
// added last. The scratch for logits, ids and weights is the block's own; it is shared by every
// layer of a model, since layers run one after another.

class MoeBlock {
 public:
  MoeBlock(Backend& backend, const ModelConfig& cfg);

  // Sizes the scratch for n tokens. Allocates: call it before a step, never inside a recording.
  void reserve(int64_t n);

  // out = routed experts(h) (+ shared).   h, out act [n, D]; router [E, D]; correction_bias f32
  // [E] (noaux_tc) or undefined; shared act [n, D] or undefined (out may be shared itself).
  void run(const Tensor& h, const Tensor& router, const Tensor& correction_bias,
           const MoeExpertWeights& experts, const Tensor& shared, Tensor& out);
  // run() in two halves, so a model can issue other work between them: route() (the router's
  // logits, moe_route and, where the backend groups pairs by expert, moe_order into the block's
  // scratch) and experts() (moe_experts over that routing). route() reads only h and the router's
  // weights and writes only the block's scratch, so it may run as a side branch beside ops that
  // read h (the shared experts).
  void route(const Tensor& h, const Tensor& router, const Tensor& correction_bias);
  void experts(const Tensor& h, const MoeExpertWeights& experts, const Tensor& shared, Tensor& out);

 private:
  Backend& backend_;
  MoeRouteParams params_;
  int64_t n_experts_;
  int64_t capacity_ = 0;
  std::unique_ptr<Buffer> buf_;
  Tensor logits_, ids_, weights_;  // f32 [cap, E], i32 [cap, K], f32 [cap, K]
  std::unique_ptr<Buffer> order_buf_;
  Tensor order_;  // the backend's grouping of cap x K pairs (moe_order); undefined if it has none
};

}  // namespace pagellm
