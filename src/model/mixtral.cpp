// Mixtral (MixtralForCausalLM): the Mistral decoder (GQA attention with RoPE, optional sliding
// window, no biases) with every MLP replaced by a sparse mixture of SwiGLU experts: a softmax
// router over num_local_experts, the top num_experts_per_tok chosen per token, their weights
// renormalized to sum to 1. Weight names are Hugging Face's checkpoint names, verbatim
// (block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1 / w2 / w3). Routing and the experts
// run on the device (MoeBlock), so a decode step never waits for the host and is recorded as a
// CUDA graph like the dense models' steps.
#include <algorithm>
#include <cmath>
#include <string>

#include "model/decoder_model.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/scratch.h"
#include "model/weight_loader.h"

namespace pagellm {
namespace {

struct MixtralLayer {
  Tensor input_layernorm, post_attention_layernorm;  // [D]
  Tensor q_proj, k_proj, v_proj;                     // [Hq*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D]
  Tensor qkv_proj;  // devices: q|k|v stacked by rows, one GEMM (the three above stay unset)
  Tensor o_proj;                                     // [D, Hq*Dh]
  Tensor router;                                     // [E, D]
  MoeExpertWeights experts;                          // w1 = gate, w3 = up, w2 = down
};

struct Workspace {
  int64_t capacity_tokens = 0;
  std::unique_ptr<Buffer> buf;
  // qkv: a step's q, k and v, column slices of one GEMM's rows on devices, else three contiguous
  // blocks of the same memory (proj_views).
  Tensor x, residual, h, qkv, attn, cos_sin;
};

class MixtralModel final : public DecoderModel {
 public:
  MixtralModel(const ModelConfig& cfg, Backend& backend)
      : DecoderModel(cfg, backend), rope_(cfg), moe_(backend, cfg) {}

  KvSpec kv_spec() const override {
    return {cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, cfg_.head_dim};
  }
  Status load(const WeightSource& w, const LoadOptions& opt) {
    const int64_t D = cfg_.hidden_size, F = cfg_.moe_intermediate_size;
    const int64_t Dh = cfg_.head_dim, Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
    const int64_t E = cfg_.n_routed_experts;
    WeightLoader ld(backend_, w, opt);
    fuse_qkv_ = backend_.device() != Device::kCpu;
    PAGELLM_RETURN_IF_ERROR(ld.embeddings_and_head(cfg_, embed_tokens_, norm_, lm_head_));
    layers_.resize(cfg_.num_hidden_layers);
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      MixtralLayer& L = layers_[i];
      PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "input_layernorm.weight", D, L.input_layernorm));
      PAGELLM_RETURN_IF_ERROR(
          ld.norm_into(p + "post_attention_layernorm.weight", D, L.post_attention_layernorm));
      const std::string a = p + "self_attn.";
      PAGELLM_RETURN_IF_ERROR(ld.qkv_into(a, "weight", Hq * Dh, Hkv * Dh, D, fuse_qkv_, L.qkv_proj,
                                          L.q_proj, L.k_proj, L.v_proj));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "self_attn.o_proj.weight", {D, Hq * Dh}, L.o_proj));
      const std::string m = p + "block_sparse_moe.";
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(m + "gate.weight", {E, D}, L.router));
      auto expert = [m](const char* w) {
        return [m, w](int64_t e) {
          return m + "experts." + std::to_string(e) + "." + w + ".weight";
        };
      };
      PAGELLM_RETURN_IF_ERROR(load_routed_experts(
          ld, backend_, E, D, F, {expert("w1"), expert("w3"), expert("w2")}, L.experts));
      unrouted_expert_bytes_ += expert_bytes(L.experts) * (E - cfg_.num_experts_per_tok);
    }
    weight_bytes_ = ld.bytes();
    storage_ = std::move(ld.storage());
    attn_params_.scale = 1.0f / std::sqrt(static_cast<float>(Dh));
    attn_params_.window = cfg_.sliding_window ? static_cast<int32_t>(*cfg_.sliding_window) : -1;
    return {};
  }

  void prepare(const StepBatch& b) override {
    reserve(b.n_tokens);
    rope_.upload_step_table(b.positions, b.cu_seqlens_q, backend_, ws_.cos_sin);
  }

  void compute(const StepBatch& b, KvCache& cache) override {
    const int64_t n = b.n_tokens, Dh = cfg_.head_dim;
    const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    PAGELLM_CHECK_MSG(n <= ws_.capacity_tokens, "compute() before prepare() sized the scratch");
    Workspace& ws = ws_;
    Tensor x = ws.x.slice_rows(0, n);                // [n, D]
    Tensor residual = ws.residual.slice_rows(0, n);  // [n, D]
    Tensor h = ws.h.slice_rows(0, n);                // [n, D]
    Tensor attn = ws.attn.slice_rows(0, n);          // [n, Hq*Dh]
    ProjViews qkv = proj_views(ws.qkv, n, {cfg_.q_dim(), cfg_.kv_dim(), cfg_.kv_dim()}, fuse_qkv_);
    Tensor q = qkv.part[0], k = qkv.part[1], v = qkv.part[2];
    Tensor q3 = q.split_heads(Hq, Dh), k3 = k.split_heads(Hkv, Dh), v3 = v.split_heads(Hkv, Dh);
    Tensor attn3 = attn.reshape({n, Hq, Dh});
    Tensor cos_sin = ws.cos_sin.slice_rows(0, n);  // f32 [n, rotary_dim], uploaded by prepare()

    backend_.embedding(embed_tokens_, b.token_ids, residual);  // [n, D]
    for (size_t l = 0; l < layers_.size(); ++l) {
      const MixtralLayer& L = layers_[l];
      if (l == 0) {
        backend_.rms_norm(residual, L.input_layernorm, eps, h);
      } else {
        backend_.add_rms_norm(x, residual, L.input_layernorm, eps, h);  // x: previous MoE out
      }
      if (fuse_qkv_) {
        backend_.matmul(h, L.qkv_proj, Tensor(), qkv.all);
      } else {
        backend_.matmul(h, L.q_proj, Tensor(), q);
        backend_.matmul(h, L.k_proj, Tensor(), k);
        backend_.matmul(h, L.v_proj, Tensor(), v);
      }
      backend_.rope_store_kv(q3, k3, v3, cos_sin, cfg_.rope.interleaved, b.slot_mapping, cache.k[l],
                             cache.v[l], cache.k_scale(l), cache.v_scale(l));
      backend_.attention(q3, cache.k[l], cache.v[l], b.attn, cache.params(l, attn_params_), attn3);
      backend_.matmul(attn, L.o_proj, Tensor(), x);  // [n, D]
      backend_.add_rms_norm(x, residual, L.post_attention_layernorm, eps, h);
      moe_.run(h, L.router, Tensor(), L.experts, Tensor(), x);  // [n, D]
    }
    backend_.add_rms_norm(x, residual, norm_, eps, h);
    head_.run(h, b, lm_head_, nullptr);
  }

 private:
  void reserve(int64_t n) {
    Workspace& ws = ws_;
    const DType dt = backend_.activation_dtype();
    const int64_t D = cfg_.hidden_size;
    const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), rd = rope_.rotary_dim();
    if (n > ws.capacity_tokens) {
      const int64_t cap = std::max<int64_t>(n, 16);
      ws.buf = allocate_scratch(backend_, cap,
                                {{&ws.x, dt, D},
                                 {&ws.residual, dt, D},
                                 {&ws.h, dt, D},
                                 {&ws.qkv, dt, qd + 2 * kvd},
                                 {&ws.attn, dt, qd},
                                 {&ws.cos_sin, DType::kF32, rd}});
      ws.capacity_tokens = cap;
    }
    moe_.reserve(n);
  }

  RotaryEmbedding rope_;
  AttentionParams attn_params_;
  MoeBlock moe_;
  std::vector<MixtralLayer> layers_;
  std::vector<std::unique_ptr<Buffer>> storage_;
  Workspace ws_;
  // Devices stack q|k|v into one GEMM (one weight stream per step instead of three); the CPU keeps
  // the checkpoint's matrices, mapped without a copy.
  bool fuse_qkv_ = false;
};

Result<std::unique_ptr<Model>> make_mixtral(const LoadedCheckpoint& ckpt, Backend& backend,
                                            const LoadOptions& opt) {
  const ModelConfig& c = ckpt.config;
  if (c.n_routed_experts <= 0) return invalid_argument(c.source + ": no experts configured");
  if (c.rotary_dim() != c.head_dim)
    return unimplemented(c.source + ": partial_rotary_factor != 1 is not supported for Mixtral");
  auto m = std::make_unique<MixtralModel>(c, backend);
  PAGELLM_RETURN_IF_ERROR(m->load(*ckpt.weights, opt));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

void register_mixtral() { register_architecture("MixtralForCausalLM", make_mixtral); }

}  // namespace pagellm
