// Mixtral (MixtralForCausalLM): the Mistral decoder (GQA attention with RoPE, optional sliding
// window, no biases) with every MLP replaced by a sparse mixture of SwiGLU experts: a softmax
// router over num_local_experts, the top num_experts_per_tok chosen per token, their weights
// renormalized to sum to 1. Weight names are Hugging Face's checkpoint names, verbatim
// (block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1 / w2 / w3).
#include <cmath>
#include <string>

#include "model/logits_head.h"
#include "model/scratch.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/weight_loader.h"

namespace pagellm {
namespace {

struct MixtralLayer {
  Tensor input_layernorm, post_attention_layernorm;  // [D]
  Tensor q_proj, k_proj, v_proj;                     // [Hq*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D]
  Tensor o_proj;                                     // [D, Hq*Dh]
  Tensor router;                                     // [E, D]
  std::vector<MoeExpert> experts;                    // w1 = gate, w3 = up, w2 = down
};

struct Workspace {
  int64_t capacity_tokens = 0;
  std::unique_ptr<Buffer> buf;
  Tensor x, residual, h, q, k, v, attn, router_logits, cos_sin;
};

class MixtralModel final : public Model {
 public:
  MixtralModel(const ModelConfig& cfg, Backend& backend)
      : cfg_(cfg), backend_(backend), rope_(cfg),
        moe_(backend, cfg.hidden_size, cfg.moe_intermediate_size) {}

  const ModelConfig& config() const override { return cfg_; }
  KvSpec kv_spec() const override {
    return {cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, cfg_.head_dim};
  }
  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t decode_weight_bytes() const override {
    // A batch-1 step reads only the top-k experts of each layer.
    const int64_t embed = dtype_bytes(embed_tokens_.dtype, embed_tokens_.numel());
    const int64_t head = dtype_bytes(lm_head_.dtype, lm_head_.numel());
    return weight_bytes_ - embed + (lm_head_.data == embed_tokens_.data ? head : 0) -
           unrouted_expert_bytes_;
  }

  Status load(const WeightSource& w, const LoadOptions& opt) {
    const int64_t D = cfg_.hidden_size, F = cfg_.moe_intermediate_size;
    const int64_t Dh = cfg_.head_dim, Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
    const int64_t E = cfg_.n_routed_experts;
    WeightLoader ld(backend_, w, opt);
    PAGELLM_RETURN_IF_ERROR(ld.embeddings_and_head(cfg_, embed_tokens_, norm_, lm_head_));
    layers_.resize(cfg_.num_hidden_layers);
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      MixtralLayer& L = layers_[i];
      PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "input_layernorm.weight", D, L.input_layernorm));
      PAGELLM_RETURN_IF_ERROR(
          ld.norm_into(p + "post_attention_layernorm.weight", D, L.post_attention_layernorm));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "self_attn.q_proj.weight", {Hq * Dh, D}, L.q_proj));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "self_attn.k_proj.weight", {Hkv * Dh, D}, L.k_proj));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "self_attn.v_proj.weight", {Hkv * Dh, D}, L.v_proj));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "self_attn.o_proj.weight", {D, Hq * Dh}, L.o_proj));
      const std::string m = p + "block_sparse_moe.";
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(m + "gate.weight", {E, D}, L.router));
      L.experts.resize(E);
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(x + "w1.weight", {F, D}, L.experts[e].gate_proj));
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(x + "w3.weight", {F, D}, L.experts[e].up_proj));
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(x + "w2.weight", {D, F}, L.experts[e].down_proj));
      }
      unrouted_expert_bytes_ += dtype_bytes(L.experts[0].gate_proj.dtype, 3 * D * F) *
                                (E - cfg_.num_experts_per_tok);
    }
    weight_bytes_ = ld.bytes();
    storage_ = std::move(ld.storage());
    attn_params_.scale = 1.0f / std::sqrt(static_cast<float>(Dh));
    attn_params_.window = cfg_.sliding_window ? static_cast<int32_t>(*cfg_.sliding_window) : -1;
    return {};
  }

  Tensor last_logits() const override { return head_.logits(); }

  void forward(const StepBatch& b, KvCache& cache, float* logits_out) override {
    const int64_t n = b.n_tokens, Dh = cfg_.head_dim, E = cfg_.n_routed_experts;
    const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    reserve(n);
    Workspace& ws = ws_;
    Tensor x = ws.x.slice_rows(0, n);                // [n, D]
    Tensor residual = ws.residual.slice_rows(0, n);  // [n, D]
    Tensor h = ws.h.slice_rows(0, n);                // [n, D]
    Tensor q = ws.q.slice_rows(0, n);                // [n, Hq*Dh]
    Tensor k = ws.k.slice_rows(0, n);                // [n, Hkv*Dh]
    Tensor v = ws.v.slice_rows(0, n);                // [n, Hkv*Dh]
    Tensor attn = ws.attn.slice_rows(0, n);          // [n, Hq*Dh]
    Tensor q3 = q.reshape({n, Hq, Dh}), k3 = k.reshape({n, Hkv, Dh}), v3 = v.reshape({n, Hkv, Dh});
    Tensor attn3 = attn.reshape({n, Hq, Dh});
    Tensor cos_sin = upload_cos_sin(b);  // f32 [n, rotary_dim]
    Tensor router_logits = ws.router_logits.slice_rows(0, n);  // f32 [n, E]

    backend_.embedding(embed_tokens_, b.token_ids, residual);  // [n, D]
    for (size_t l = 0; l < layers_.size(); ++l) {
      const MixtralLayer& L = layers_[l];
      if (l == 0) {
        backend_.rms_norm(residual, L.input_layernorm, eps, h);
      } else {
        backend_.add_rms_norm(x, residual, L.input_layernorm, eps, h);  // x: previous MoE out
      }
      backend_.matmul(h, L.q_proj, Tensor(), q);
      backend_.matmul(h, L.k_proj, Tensor(), k);
      backend_.matmul(h, L.v_proj, Tensor(), v);
      backend_.rope_store_kv(q3, k3, v3, cos_sin, cfg_.rope.interleaved, b.slot_mapping,
                             cache.k[l], cache.v[l]);
      backend_.attention(q3, cache.k[l], cache.v[l], b.attn, attn_params_, attn3);
      backend_.matmul(attn, L.o_proj, Tensor(), x);  // [n, D]
      backend_.add_rms_norm(x, residual, L.post_attention_layernorm, eps, h);
      backend_.matmul(h, L.router, Tensor(), router_logits);
      host_logits_.resize(n * E);
      backend_.copy_to_host(host_logits_.data(), router_logits.data, n * E * sizeof(float));
      route_tokens(cfg_, host_logits_.data(), nullptr, n, routing_);
      moe_.run(h, routing_, L.experts, x);  // [n, D]
    }
    backend_.add_rms_norm(x, residual, norm_, eps, h);
    head_.run(h, b, lm_head_, logits_out);
  }

 private:
  void reserve(int64_t n) {
    Workspace& ws = ws_;
    const DType dt = backend_.activation_dtype();
    const int64_t D = cfg_.hidden_size, E = cfg_.n_routed_experts;
    const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), rd = rope_.rotary_dim();
    if (n > ws.capacity_tokens) {
      const int64_t cap = std::max<int64_t>(n, 16);
      ws.buf = allocate_scratch(
          backend_, cap,
          {{&ws.x, dt, D}, {&ws.residual, dt, D}, {&ws.h, dt, D}, {&ws.q, dt, qd}, {&ws.k, dt, kvd},
           {&ws.v, dt, kvd}, {&ws.attn, dt, qd}, {&ws.router_logits, DType::kF32, E},
           {&ws.cos_sin, DType::kF32, rd}});
      ws.capacity_tokens = cap;
    }
  }

  Tensor upload_cos_sin(const StepBatch& b) {
    return rope_.upload_step_table(b.positions, b.cu_seqlens_q, backend_, ws_.cos_sin);
  }

  ModelConfig cfg_;
  Backend& backend_;
  RotaryEmbedding rope_;
  AttentionParams attn_params_;
  MoeExperts moe_;
  MoeRouting routing_;
  Tensor embed_tokens_, norm_, lm_head_;
  std::vector<MixtralLayer> layers_;
  std::vector<std::unique_ptr<Buffer>> storage_;
  int64_t weight_bytes_ = 0;
  int64_t unrouted_expert_bytes_ = 0;
  Workspace ws_;
  LogitsHead head_{backend_};
  std::vector<float> host_logits_;
};

Result<std::unique_ptr<Model>> make_mixtral(const LoadedCheckpoint& ckpt, Backend& backend,
                                            const LoadOptions& opt) {
  const ModelConfig& c = ckpt.config;
  if (c.n_routed_experts <= 0) return invalid_argument(c.source + ": no experts configured");
  if (c.rotary_dim() != c.head_dim)
    return unimplemented(c.source + ": partial_rotary_factor != 1 is not supported for Mixtral");
  if (backend.device() != Device::kCpu || backend.activation_dtype() != DType::kF32) {
    return unimplemented(c.source + ": " + c.architecture + " (MoE) runs on the CPU backend only "
                         "for now, not on '" + backend.name() + "'");
  }
  auto m = std::make_unique<MixtralModel>(c, backend);
  PAGELLM_RETURN_IF_ERROR(m->load(*ckpt.weights, opt));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

void register_mixtral() { register_architecture("MixtralForCausalLM", make_mixtral); }

}  // namespace pagellm
