// The Llama family: LlamaForCausalLM (Llama 2/3/3.x, CodeLlama, DeepSeek-Coder, DeepSeek-LLM, Yi),
// MistralForCausalLM (sliding window), Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (q/k norm,
// explicit head_dim). Pre-norm decoder: RMSNorm -> GQA attention with RoPE -> residual ->
// RMSNorm -> SwiGLU MLP -> residual. Weight names are Hugging Face's, verbatim.
#include <array>
#include <cmath>
#include <string>

#include "core/log.h"
#include "model/decoder_model.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/scratch.h"
#include "model/weight_loader.h"

namespace pagellm {
namespace {

struct LlamaLayer {
  Tensor input_layernorm;           // [D]
  Tensor q_proj, k_proj, v_proj;    // [Hq*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D]
  Tensor q_bias, k_bias, v_bias;    // [Hq*Dh], [Hkv*Dh], [Hkv*Dh] (Qwen2, attention_bias)
  Tensor qkv_proj, qkv_bias;        // fused (devices): q|k|v stacked by rows
  Tensor o_proj, o_bias;            // [D, Hq*Dh], [D]
  Tensor q_norm, k_norm;            // [Dh] (Qwen3)
  Tensor post_attention_layernorm;  // [D]
  Tensor gate_proj, up_proj;        // [F, D]
  Tensor gate_up_proj, gate_up_bias;  // fused (devices): gate|up stacked by rows, [2F, D]
  Tensor down_proj;                 // [D, F]
  Tensor gate_bias, up_bias, down_bias;  // mlp_bias
};

// Scratch activations for one step, grown on demand (never shrunk) so steady-state steps do not
// allocate.
struct Workspace {
  int64_t capacity_tokens = 0;
  std::unique_ptr<Buffer> buf;
  // qkv holds a step's q, k and v: column slices of each row when the projection is fused,
  // else three contiguous blocks carved from the same memory (see proj_views); gate_up likewise.
  Tensor x, residual, h, qkv, attn, gate_up, act;  // [cap, ...]
  Tensor cos_sin;  // f32 [cap, rotary_dim]
};

class LlamaModel final : public DecoderModel {
 public:
  LlamaModel(const ModelConfig& cfg, Backend& backend) : DecoderModel(cfg, backend), rope_(cfg) {}

  KvSpec kv_spec() const override {
    return {cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, cfg_.head_dim};
  }
  Status load(const WeightSource& w, const LoadOptions& opt) {
    const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size;
    const int64_t Dh = cfg_.head_dim, Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
    WeightLoader ld(backend_, w, opt);
    fuse_mlp_ = backend_.device() != Device::kCpu;
    fuse_qkv_ = fuse_mlp_ && !cfg_.qk_norm;
    PAGELLM_RETURN_IF_ERROR(ld.embeddings_and_head(cfg_, embed_tokens_, norm_, lm_head_));
    layers_.resize(cfg_.num_hidden_layers);
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LlamaLayer& L = layers_[i];
      PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "input_layernorm.weight", D, L.input_layernorm));
      PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "post_attention_layernorm.weight", D, L.post_attention_layernorm));
      const std::string a = p + "self_attn.";
      PAGELLM_RETURN_IF_ERROR(ld.qkv_into(a, "weight", Hq * Dh, Hkv * Dh, D, fuse_qkv_, L.qkv_proj,
                                          L.q_proj, L.k_proj, L.v_proj));
      if (cfg_.attention_bias) {
        PAGELLM_RETURN_IF_ERROR(ld.qkv_into(a, "bias", Hq * Dh, Hkv * Dh, 0, fuse_qkv_, L.qkv_bias,
                                            L.q_bias, L.k_bias, L.v_bias));
      }
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "o_proj.weight", {D, Hq * Dh}, L.o_proj));
      if (cfg_.o_proj_bias) PAGELLM_RETURN_IF_ERROR(ld.bias_into(p + "self_attn.o_proj.bias", D, L.o_bias));
      if (cfg_.qk_norm) {
        PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "self_attn.q_norm.weight", Dh, L.q_norm));
        PAGELLM_RETURN_IF_ERROR(ld.norm_into(p + "self_attn.k_norm.weight", Dh, L.k_norm));
      }
      const std::string m = p + "mlp.";
      if (fuse_mlp_) {
        PAGELLM_ASSIGN_OR_RETURN(
            L.gate_up_proj,
            ld.stacked_matrix({{m + "gate_proj.weight", F}, {m + "up_proj.weight", F}}, D));
        if (cfg_.mlp_bias) {
          PAGELLM_ASSIGN_OR_RETURN(
              L.gate_up_bias,
              ld.stacked_vector({{m + "gate_proj.bias", F}, {m + "up_proj.bias", F}}, 0.0f));
        }
      } else {
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(m + "gate_proj.weight", {F, D}, L.gate_proj));
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(m + "up_proj.weight", {F, D}, L.up_proj));
        if (cfg_.mlp_bias) {
          PAGELLM_RETURN_IF_ERROR(ld.bias_into(m + "gate_proj.bias", F, L.gate_bias));
          PAGELLM_RETURN_IF_ERROR(ld.bias_into(m + "up_proj.bias", F, L.up_bias));
        }
      }
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(m + "down_proj.weight", {D, F}, L.down_proj));
      if (cfg_.mlp_bias) PAGELLM_RETURN_IF_ERROR(ld.bias_into(m + "down_proj.bias", D, L.down_bias));
      // Where one projection reads a norm's output, the backend may fold the norm's weight into
      // it (Backend::fold_norm_weight); the norm then runs with the weight it hands back.
      if (fuse_qkv_) L.input_layernorm = backend_.fold_norm_weight(L.input_layernorm, L.qkv_proj);
      if (fuse_mlp_) {
        L.post_attention_layernorm =
            backend_.fold_norm_weight(L.post_attention_layernorm, L.gate_up_proj);
      }
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
    Tensor act = ws.act.slice_rows(0, n);            // [n, F]
    ProjViews qkv = proj_views(ws.qkv, n, {cfg_.q_dim(), cfg_.kv_dim(), cfg_.kv_dim()}, fuse_qkv_);
    ProjViews gu =
        proj_views(ws.gate_up, n, {cfg_.intermediate_size, cfg_.intermediate_size}, fuse_mlp_);
    Tensor q = qkv.part[0], k = qkv.part[1], v = qkv.part[2];
    Tensor gate = gu.part[0], up = gu.part[1];
    Tensor q3 = q.split_heads(Hq, Dh), k3 = k.split_heads(Hkv, Dh), v3 = v.split_heads(Hkv, Dh);
    Tensor attn3 = attn.reshape({n, Hq, Dh});
    Tensor cos_sin = ws.cos_sin.slice_rows(0, n);  // f32 [n, rotary_dim], uploaded by prepare()

    // The residual stream is complete at each op that reads it: the output projections add into
    // it (matmul_add) and each block's pre-norm is part of the projection that follows it
    // (rms_norm_matmul / rms_norm_swiglu), so a backend can fuse both into its GEMV. x and h are
    // the scratch of a backend that runs those steps apart; h holds the normalized rows only
    // where the weights are split (separate q/k/v or gate/up) and several products read them.
    backend_.embedding(embed_tokens_, b.token_ids, residual);  // [n, D]
    // With the projections fused, what runs from one layer's attention to the next is a chain of
    // products (Backend::projection_chain): o_proj, the MLP and the next layer's q|k|v.
    const bool chained = fuse_qkv_ && fuse_mlp_;
    using Link = Backend::ProjectionLink;
    const auto qkv_link = [&](const LlamaLayer& L) {
      return Link{Link::Kind::kNormMatmul,
                  &residual,
                  &L.input_layernorm,
                  eps,
                  &L.qkv_proj,
                  &L.qkv_bias,
                  &h,
                  nullptr,
                  &qkv.all};
    };
    if (chained && !layers_.empty()) backend_.projection_chain({qkv_link(layers_[0])});
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LlamaLayer& L = layers_[l];
      if (fuse_qkv_ && !chained) {
        backend_.rms_norm_matmul(residual, L.input_layernorm, eps, L.qkv_proj, L.qkv_bias, h,
                                 qkv.all);
      } else if (!fuse_qkv_) {
        backend_.rms_norm(residual, L.input_layernorm, eps, h);
        backend_.matmul(h, L.q_proj, L.q_bias, q);
        backend_.matmul(h, L.k_proj, L.k_bias, k);
        backend_.matmul(h, L.v_proj, L.v_bias, v);
      }
      if (cfg_.qk_norm) {  // Qwen3: RMSNorm over each head before RoPE (q, k contiguous here)
        Tensor qh = q.reshape({n * Hq, Dh}), kh = k.reshape({n * Hkv, Dh});
        backend_.rms_norm(qh, L.q_norm, eps, qh);
        backend_.rms_norm(kh, L.k_norm, eps, kh);
      }
      backend_.rope_store_kv(q3, k3, v3, cos_sin, cfg_.rope.interleaved, b.slot_mapping, cache.k[l],
                             cache.v[l], cache.k_scale(l), cache.v_scale(l));
      backend_.attention(q3, cache.k[l], cache.v[l], b.attn, cache.params(l, attn_params_), attn3);
      if (chained) {
        std::vector<Link> links = {
            // residual += o_proj(attn); act = SwiGLU(norm(residual)); residual += down(act)
            {Link::Kind::kMatmulAdd, &attn, nullptr, 0.0f, &L.o_proj, &L.o_bias, &x, nullptr,
             &residual},
            {Link::Kind::kNormSwiGlu, &residual, &L.post_attention_layernorm, eps, &L.gate_up_proj,
             &L.gate_up_bias, &h, &gu.all, &act},
            {Link::Kind::kMatmulAdd, &act, nullptr, 0.0f, &L.down_proj, &L.down_bias, &x, nullptr,
             &residual}};
        if (l + 1 < layers_.size()) links.push_back(qkv_link(layers_[l + 1]));
        backend_.projection_chain(links);
        continue;
      }
      backend_.matmul_add(attn, L.o_proj, L.o_bias, x, residual);  // residual += o_proj(attn)
      if (fuse_mlp_) {
        backend_.rms_norm_swiglu(residual, L.post_attention_layernorm, eps, L.gate_up_proj,
                                 L.gate_up_bias, h, gu.all, act);
      } else {
        backend_.rms_norm(residual, L.post_attention_layernorm, eps, h);
        backend_.matmul(h, L.gate_proj, L.gate_bias, gate);
        backend_.matmul(h, L.up_proj, L.up_bias, up);
        backend_.silu_mul(gate, up, act);
      }
      backend_.matmul_add(act, L.down_proj, L.down_bias, x, residual);  // residual += down(act)
    }
    backend_.rms_norm(residual, norm_, eps, h);
    head_.run(h, b, lm_head_, nullptr);
  }

 private:
  // Grows the workspace to hold n tokens.
  void reserve(int64_t n) {
    Workspace& ws = ws_;
    const DType dt = backend_.activation_dtype();
    const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size;
    const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), rd = rope_.rotary_dim();
    if (n > ws.capacity_tokens) {
      const int64_t cap = std::max<int64_t>(n, 16);
      ws.buf = allocate_scratch(
          backend_, cap,
          {{&ws.x, dt, D}, {&ws.residual, dt, D}, {&ws.h, dt, D}, {&ws.qkv, dt, qd + 2 * kvd},
           {&ws.attn, dt, qd}, {&ws.gate_up, dt, 2 * F}, {&ws.act, dt, F},
           {&ws.cos_sin, DType::kF32, rd}});
      ws.capacity_tokens = cap;
    }
  }

  RotaryEmbedding rope_;
  AttentionParams attn_params_;
  std::vector<LlamaLayer> layers_;
  std::vector<std::unique_ptr<Buffer>> storage_;
  Workspace ws_;
  // Devices stack q|k|v and gate|up into one GEMM each; the CPU keeps the checkpoint's matrices
  // (mapped without a copy). Qwen3's per-head q/k norm wants contiguous q and k, so no q|k|v there.
  bool fuse_mlp_ = false;
  bool fuse_qkv_ = false;
};

Result<std::unique_ptr<Model>> make_llama(const LoadedCheckpoint& ckpt, Backend& backend,
                                          const LoadOptions& opt) {
  const ModelConfig& c = ckpt.config;
  if (c.hidden_act != "silu")
    return unimplemented(c.source + ": hidden_act '" + c.hidden_act + "' is not supported (silu)");
  if (c.rotary_dim() != c.head_dim)
    return unimplemented(c.source + ": partial_rotary_factor != 1 is not supported for " +
                         c.architecture);
  auto m = std::make_unique<LlamaModel>(c, backend);
  PAGELLM_RETURN_IF_ERROR(m->load(*ckpt.weights, opt));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

void register_llama_family() {
  for (const char* name : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM"})
    register_architecture(name, make_llama);
}

}  // namespace pagellm
