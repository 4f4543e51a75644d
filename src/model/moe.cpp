#include "model/moe.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "model/scratch.h"

namespace pagellm {

Status load_swiglu(WeightLoader& ld, Backend& backend, const std::string& prefix, int64_t D,
                   int64_t F, MoeExpert& out) {
  if (backend.device() != Device::kCpu) {
    PAGELLM_ASSIGN_OR_RETURN(
        out.gate_up_proj,
        ld.stacked_matrix({{prefix + "gate_proj.weight", F}, {prefix + "up_proj.weight", F}}, D));
  } else {
    PAGELLM_RETURN_IF_ERROR(ld.matrix_into(prefix + "gate_proj.weight", {F, D}, out.gate_proj));
    PAGELLM_RETURN_IF_ERROR(ld.matrix_into(prefix + "up_proj.weight", {F, D}, out.up_proj));
  }
  return ld.matrix_into(prefix + "down_proj.weight", {D, F}, out.down_proj);
}

void run_swiglu(Backend& backend, const MoeExpert& mlp, const Tensor& h, Tensor& gate_up,
                Tensor& act, Tensor& out) {
  const int64_t F = act.cols();
  PAGELLM_CHECK(gate_up.cols() == 2 * F);
  Tensor gate = gate_up.slice_cols(0, F), up = gate_up.slice_cols(F, 2 * F);
  if (mlp.gate_up_proj.defined()) {
    backend.matmul_swiglu(h, mlp.gate_up_proj, Tensor(), gate_up, act);
  } else {
    backend.matmul(h, mlp.gate_proj, Tensor(), gate);
    backend.matmul(h, mlp.up_proj, Tensor(), up);
    backend.silu_mul(gate, up, act);
  }
  backend.matmul(act, mlp.down_proj, Tensor(), out);
}

MoeRouteParams moe_route_params(const ModelConfig& cfg) {
  MoeRouteParams p;
  p.top_k = static_cast<int32_t>(cfg.num_experts_per_tok);
  p.scoring =
      cfg.scoring_func == MoeScoring::kSigmoid ? MoeScoreFunc::kSigmoid : MoeScoreFunc::kSoftmax;
  switch (cfg.topk_method) {
    case MoeTopk::kGreedy:
      p.select = MoeSelect::kGreedy;
      break;
    case MoeTopk::kGroupLimitedGreedy:
      p.select = MoeSelect::kGroupLimitedGreedy;
      break;
    case MoeTopk::kNoauxTc:
      p.select = MoeSelect::kNoauxTc;
      break;
  }
  p.n_group = static_cast<int32_t>(std::max<int64_t>(cfg.n_group, 1));
  p.topk_group = static_cast<int32_t>(std::max<int64_t>(cfg.topk_group, 1));
  p.norm_topk_prob = cfg.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(cfg.routed_scaling_factor);
  return p;
}

Status load_routed_experts(WeightLoader& ld, Backend& backend, int64_t E, int64_t D, int64_t F,
                           const ExpertNames& names, MoeExpertWeights& out) {
  out = MoeExpertWeights{};
  if (backend.device() != Device::kCpu) {
    std::vector<WeightLoader::Part> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      gate_up.push_back({names.gate(e), F});
      gate_up.push_back({names.up(e), F});
      down.push_back({names.down(e), D});
    }
    // The device MoE kernels read bf16, 4-bit (I4G) or FP8 (F8G128, F8Row) experts: quantized
    // ones stay so where both stacks fit the device's layout, every other type is dequantized.
    const auto readable = [](DType t) {
      return t == DType::kBF16 || is_group_int4(t) || t == DType::kF8G128 || t == DType::kF8Row;
    };
    const DType gu_kept = ld.device_stack_type(gate_up, D), dn_kept = ld.device_stack_type(down, F);
    const bool keep = gu_kept != DType::kF32 && dn_kept != DType::kF32 && readable(gu_kept) &&
                      readable(dn_kept) && is_group_int4(gu_kept) == is_group_int4(dn_kept);
    PAGELLM_ASSIGN_OR_RETURN(Tensor gu, ld.stacked_matrix(gate_up, D, keep));  // [E*2F, D]
    PAGELLM_ASSIGN_OR_RETURN(Tensor dn, ld.stacked_matrix(down, F, keep));     // [E*D, F]
    // The kernels take both stacks of one kind. An FP8 stack whose scales change within 128
    // columns (no checkpoint scheme's) is uploaded as bf16: the other one is then loaded again
    // as bf16 (its quantized copy stays allocated with the model's weights).
    if (is_quantized(gu.dtype) != is_quantized(dn.dtype)) {
      if (is_quantized(gu.dtype)) {
        PAGELLM_ASSIGN_OR_RETURN(gu, ld.stacked_matrix(gate_up, D, false));
      } else {
        PAGELLM_ASSIGN_OR_RETURN(dn, ld.stacked_matrix(down, F, false));
      }
    }
    if (!readable(gu.dtype) || !readable(dn.dtype)) {
      return unimplemented("routed experts stored as " + std::string(dtype_name(gu.dtype)) +
                           ": the device MoE kernels read bf16, 4-bit or FP8 expert weights");
    }
    out.gate_up = gu.reshape({E, 2 * F, D});
    out.down = dn.reshape({E, D, F});
    return {};
  }
  out.gate.resize(E);
  out.up.resize(E);
  out.down_each.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    PAGELLM_RETURN_IF_ERROR(ld.matrix_into(names.gate(e), {F, D}, out.gate[e]));
    PAGELLM_RETURN_IF_ERROR(ld.matrix_into(names.up(e), {F, D}, out.up[e]));
    PAGELLM_RETURN_IF_ERROR(ld.matrix_into(names.down(e), {D, F}, out.down_each[e]));
  }
  return {};
}

int64_t expert_bytes(const MoeExpertWeights& w) {
  if (w.n_experts() == 0) return 0;
  const DType dt = w.stacked() ? w.gate_up.dtype : w.gate[0].dtype;
  return dtype_bytes(dt, 3 * w.hidden() * w.inter());
}

MoeBlock::MoeBlock(Backend& backend, const ModelConfig& cfg)
    : backend_(backend), params_(moe_route_params(cfg)), n_experts_(cfg.n_routed_experts) {}

void MoeBlock::reserve(int64_t n) {
  if (n <= capacity_) return;
  const int64_t cap = std::max<int64_t>(n, 16);
  buf_ = allocate_scratch(backend_, cap,
                          {{&logits_, DType::kF32, n_experts_},
                           {&ids_, DType::kI32, params_.top_k},
                           {&weights_, DType::kF32, params_.top_k}});
  const int64_t order_bytes = backend_.moe_order_bytes(cap * params_.top_k, n_experts_);
  order_buf_.reset();
  order_ = Tensor();
  if (order_bytes > 0) {
    order_buf_ = backend_.must_allocate(order_bytes, "the MoE expert order");
    order_ = Tensor(order_buf_->data(), DType::kI32, {order_bytes / 4}, backend_.device());
  }
  capacity_ = cap;
}

void MoeBlock::run(const Tensor& h, const Tensor& router, const Tensor& correction_bias,
                   const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) {
  route(h, router, correction_bias);
  this->experts(h, experts, shared, out);
}

void MoeBlock::route(const Tensor& h, const Tensor& router, const Tensor& correction_bias) {
  const int64_t n = h.rows();
  PAGELLM_CHECK_MSG(n <= capacity_, "MoeBlock::route before reserve() sized its scratch");
  Tensor logits = logits_.slice_rows(0, n);  // f32 [n, E]
  Tensor ids = ids_.slice_rows(0, n);        // i32 [n, K]
  Tensor weights = weights_.slice_rows(0, n);
  backend_.matmul(h, router, Tensor(), logits);
  backend_.moe_route(logits, correction_bias, params_, ids, weights);
  if (order_.defined()) backend_.moe_order(ids, n_experts_, order_);
}

void MoeBlock::experts(const Tensor& h, const MoeExpertWeights& experts, const Tensor& shared,
                       Tensor& out) {
  const int64_t n = h.rows();
  PAGELLM_CHECK_MSG(n <= capacity_, "MoeBlock::experts before reserve() sized its scratch");
  // Without an order (a backend that groups nothing) this is moe_experts (Backend's default).
  backend_.moe_experts_ordered(h, ids_.slice_rows(0, n), weights_.slice_rows(0, n), order_, experts,
                               shared, out);  // [n, D]
}

}  // namespace pagellm
