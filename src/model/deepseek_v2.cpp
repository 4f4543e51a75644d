// DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): pre-norm decoder with
// multi-head latent attention (MLA) and DeepSeekMoE (routed + shared experts; the first
// first_k_dense_replace layers use a dense MLP). Weight names are Hugging Face's, verbatim.
//
// MLA keeps one latent row per token in the KV cache: [k_pe (rope dim P) | c_kv (kv_lora_rank R)],
// where c_kv = kv_a_layernorm(kv_a_proj_with_mqa(h)[:R]) and k_pe is the rotated shared key. The
// per-head keys and values are never materialized: attention runs in the absorbed form, with
// W_UK (the key half of kv_b_proj) folded into the query:
//   q_abs_h = W_UK_h^T q_nope_h                         [R]
//   score   = (q_pe_h . k_pe + q_abs_h . c_kv) * scale  (one "head" of dim P + R against the latent)
//   o_h     = W_UV_h (softmax . c_kv)                   [v_head_dim]
// which is the same sum as transformers' expanded form (only summation order differs). The latent
// cache is the attention op's K (dim P + R) and, as a column view of the same rows, its V (dim R).
// The row puts k_pe first because the rope op rotates the leading dims of each head. The per-head
// products (q_h -> [q_pe | q_abs_h], W_UV_h) are one batched matmul each over the heads (a strided
// batched GEMM on devices); q_absorb is built where the weights live, from kv_b_proj, by backend
// ops, so the CPU golden tests check the same op sequence the GPU runs.
#include <cmath>
#include <cstring>
#include <string>

#include "core/log.h"
#include "model/decoder_model.h"
#include "model/scratch.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/weight_loader.h"

namespace pagellm {
namespace {

struct DeepseekLayer {
  Tensor input_layernorm, post_attention_layernorm;  // [D]
  Tensor q_proj;                    // [H*(N+P), D] (no q_lora_rank)
  Tensor q_a_proj, q_a_bias;        // [Rq, D], [Rq]
  Tensor q_a_layernorm;             // [Rq]
  Tensor q_b_proj;                  // [H*(N+P), Rq]
  Tensor kv_a, kv_a_bias;           // kv_a_proj_with_mqa, rows reordered to k_pe | c_kv: [P+R, D]
  Tensor kv_a_layernorm;            // [R]
  Tensor kv_b_proj;                 // [H*(N+V), R]
  Tensor q_absorb;                  // act [H, P+R, N+P]: per head [[0 | I_P], [W_UK_h^T | 0]]
  Tensor w_uv;                      // [H, Vd, R]: W_UV_h, rows h*(N+Vd)+N.. of kv_b_proj (a view)
  Tensor o_proj, o_bias;            // [D, H*V], [D]
  bool moe = false;
  MoeExpert mlp;                    // dense layers
  Tensor router, correction_bias;   // [E, D], [E] (V3)
  MoeExpertWeights experts;         // E routed experts (stacked on devices)
  MoeExpert shared;                 // intermediate moe_intermediate_size * n_shared_experts
};

struct Workspace {
  int64_t capacity_tokens = 0;
  std::unique_ptr<Buffer> buf;
  Tensor x, residual, h, qa, q, lat, qfull, attn_lat, attn_v, gate_up, act, shared;
  Tensor cos_sin;                  // f32 [cap, P]
};

// Head h of an activation [n, heads * dim] as entry h of a [heads, n, dim] view: batched_matmul's
// operand for per-head products (batch stride dim, row stride the activation's).
Tensor heads_major(const Tensor& t, int64_t heads, int64_t dim) {
  PAGELLM_CHECK(t.ndim == 2 && t.cols() == heads * dim);
  Tensor v = t;
  v.ndim = 3;
  v.shape = {heads, t.rows(), dim, 1};
  v.stride = {dim, t.row_stride(), 1, 0};
  return v;
}

class DeepseekModel final : public DecoderModel {
 public:
  DeepseekModel(const ModelConfig& cfg, Backend& backend)
      : DecoderModel(cfg, backend), rope_(cfg), moe_(backend, cfg) {}

  KvSpec kv_spec() const override {
    return {cfg_.num_hidden_layers, 1, cfg_.qk_rope_head_dim + cfg_.kv_lora_rank, 0};
  }

  Status load(const WeightSource& w, const LoadOptions& opt) {
    const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size;
    const int64_t H = cfg_.num_attention_heads, N = cfg_.qk_nope_head_dim;
    const int64_t P = cfg_.qk_rope_head_dim, R = cfg_.kv_lora_rank, Vd = cfg_.v_head_dim;
    const int64_t E = cfg_.n_routed_experts, Fm = cfg_.moe_intermediate_size;
    WeightLoader ld(backend_, w, opt);
    auto vec = [&](const std::string& name, int64_t n, float dummy, Tensor& out) -> Status {
      PAGELLM_ASSIGN_OR_RETURN(out, ld.vector(name, n, dummy));
      return {};
    };
    auto swiglu = [&](const std::string& p, int64_t f, MoeExpert& m) {
      return load_swiglu(ld, backend_, p, D, f, m);
    };
    PAGELLM_RETURN_IF_ERROR(ld.embeddings_and_head(cfg_, embed_tokens_, norm_, lm_head_));
    if (cfg_.num_nextn_predict_layers > 0) {
      PAGELLM_LOG_INFO("%s: skipping %lld multi-token-prediction layer(s) (model.layers.%lld.*)",
                       cfg_.source.c_str(), static_cast<long long>(cfg_.num_nextn_predict_layers),
                       static_cast<long long>(cfg_.num_hidden_layers));
    }
    layers_.resize(cfg_.num_hidden_layers);
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const std::string a = p + "self_attn.";
      DeepseekLayer& L = layers_[i];
      PAGELLM_RETURN_IF_ERROR(vec(p + "input_layernorm.weight", D, 1.0f, L.input_layernorm));
      PAGELLM_RETURN_IF_ERROR(
          vec(p + "post_attention_layernorm.weight", D, 1.0f, L.post_attention_layernorm));
      if (cfg_.q_lora_rank) {
        const int64_t Rq = *cfg_.q_lora_rank;
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "q_a_proj.weight", {Rq, D}, L.q_a_proj));
        if (cfg_.attention_bias)
          PAGELLM_RETURN_IF_ERROR(vec(a + "q_a_proj.bias", Rq, 0.0f, L.q_a_bias));
        PAGELLM_RETURN_IF_ERROR(vec(a + "q_a_layernorm.weight", Rq, 1.0f, L.q_a_layernorm));
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "q_b_proj.weight", {H * (N + P), Rq}, L.q_b_proj));
      } else {
        PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "q_proj.weight", {H * (N + P), D}, L.q_proj));
      }
      // The checkpoint's rows are c_kv (R) then k_pe (P); the cache row is k_pe | c_kv.
      const WeightLoader::RowRanges pe_first = {{R, R + P}, {0, R}};
      PAGELLM_ASSIGN_OR_RETURN(
          L.kv_a, ld.reordered_matrix(a + "kv_a_proj_with_mqa.weight", {R + P, D}, pe_first));
      if (cfg_.attention_bias) {
        PAGELLM_ASSIGN_OR_RETURN(L.kv_a_bias, ld.reordered_vector(a + "kv_a_proj_with_mqa.bias",
                                                                  R + P, 0.0f, pe_first));
      }
      PAGELLM_RETURN_IF_ERROR(vec(a + "kv_a_layernorm.weight", R, 1.0f, L.kv_a_layernorm));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "kv_b_proj.weight", {H * (N + Vd), R}, L.kv_b_proj));
      PAGELLM_RETURN_IF_ERROR(build_absorbed_query(a + "kv_b_proj.weight", L));
      L.w_uv = L.kv_b_proj;  // rows [h*(N+Vd) + N, +Vd) of each head: [H, Vd, R]
      L.w_uv.data = static_cast<char*>(L.kv_b_proj.data) + dtype_bytes(L.kv_b_proj.dtype, N * R);
      L.w_uv.ndim = 3;
      L.w_uv.shape = {H, Vd, R, 1};
      L.w_uv.stride = {(N + Vd) * R, R, 1, 0};
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "o_proj.weight", {D, H * Vd}, L.o_proj));
      if (cfg_.attention_bias) PAGELLM_RETURN_IF_ERROR(vec(a + "o_proj.bias", D, 0.0f, L.o_bias));

      L.moe = i >= cfg_.first_k_dense_replace;
      if (!L.moe) {
        PAGELLM_RETURN_IF_ERROR(swiglu(p + "mlp.", F, L.mlp));
        continue;
      }
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "mlp.gate.weight", {E, D}, L.router));
      if (cfg_.topk_method == MoeTopk::kNoauxTc) {
        PAGELLM_RETURN_IF_ERROR(
            vec(p + "mlp.gate.e_score_correction_bias", E, 0.0f, L.correction_bias));
      }
      auto expert = [&p](const char* w) {
        return [p, w](int64_t e) {
          return p + "mlp.experts." + std::to_string(e) + "." + w + ".weight";
        };
      };
      PAGELLM_RETURN_IF_ERROR(load_routed_experts(
          ld, backend_, E, D, Fm, {expert("gate_proj"), expert("up_proj"), expert("down_proj")},
          L.experts));
      if (cfg_.n_shared_experts > 0) {
        PAGELLM_RETURN_IF_ERROR(
            swiglu(p + "mlp.shared_experts.", Fm * cfg_.n_shared_experts, L.shared));
      }
      unrouted_expert_bytes_ += expert_bytes(L.experts) * (E - cfg_.num_experts_per_tok);
    }
    // The absorbed query blocks are read every step too.
    weight_bytes_ = ld.bytes() + dtype_bytes(backend_.activation_dtype(),
                                             static_cast<int64_t>(layers_.size()) * H * (P + R) *
                                                 (N + P));
    absorb_template_.reset();
    absorb_identity_.reset();
    storage_ = std::move(ld.storage());
    // transformers: 1/sqrt(qk_head_dim), times yarn's mscale(factor, mscale_all_dim)^2.
    double scale = 1.0 / std::sqrt(static_cast<double>(N + P));
    const RopeConfig& r = cfg_.rope;
    if (r.type != RopeType::kDefault && r.mscale_all_dim && *r.mscale_all_dim != 0 &&
        r.factor > 1) {
      const double m = 0.1 * *r.mscale_all_dim * std::log(r.factor) + 1.0;
      scale *= m * m;
    }
    attn_params_.scale = static_cast<float>(scale);
    return {};
  }

  int32_t max_graph_batch() const override { return moe_graph_batch_limit(cfg_); }

  void prepare(const StepBatch& b) override {
    reserve(b.n_tokens);
    upload_cos_sin(b);
  }

  void compute(const StepBatch& b, KvCache& cache) override {
    const int64_t n = b.n_tokens, H = cfg_.num_attention_heads;
    const int64_t N = cfg_.qk_nope_head_dim, P = cfg_.qk_rope_head_dim;
    const int64_t R = cfg_.kv_lora_rank, Vd = cfg_.v_head_dim;
    const int64_t F = cfg_.intermediate_size, Fs = cfg_.moe_intermediate_size * cfg_.n_shared_experts;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    PAGELLM_CHECK_MSG(n <= ws_.capacity_tokens, "compute() before prepare() sized the scratch");
    Workspace& ws = ws_;
    Tensor x = ws.x.slice_rows(0, n);                // [n, D]
    Tensor residual = ws.residual.slice_rows(0, n);  // [n, D]
    Tensor h = ws.h.slice_rows(0, n);                // [n, D]
    Tensor q = ws.q.slice_rows(0, n);                // [n, H*(N+P)]
    Tensor lat = ws.lat.slice_rows(0, n);            // [n, P+R]: k_pe | c_kv
    Tensor qfull = ws.qfull.slice_rows(0, n);        // [n, H*(P+R)]: per head q_pe | q_abs
    Tensor attn_lat = ws.attn_lat.slice_rows(0, n);  // [n, H*R]
    Tensor attn_v = ws.attn_v.slice_rows(0, n);      // [n, H*Vd]
    Tensor lat_c = lat.slice_cols(P, P + R);                                  // [n, R]
    Tensor lat3 = lat.reshape({n, 1, P + R});                                // [n, 1, P+R]
    Tensor lat3_c = lat3.slice_cols(P, P + R);                               // [n, 1, R]
    Tensor qfull3 = qfull.reshape({n, H, P + R});                            // [n, H, P+R]
    Tensor attn_lat3 = attn_lat.reshape({n, H, R});                          // [n, H, R]
    Tensor cos_sin = ws.cos_sin.slice_rows(0, n);  // f32 [n, P], uploaded by prepare()

    backend_.embedding(embed_tokens_, b.token_ids, residual);  // [n, D]
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DeepseekLayer& L = layers_[l];
      if (l == 0) {
        backend_.rms_norm(residual, L.input_layernorm, eps, h);
      } else {
        backend_.add_rms_norm(x, residual, L.input_layernorm, eps, h);  // x: previous MLP out
      }
      // --- MLA ---
      if (cfg_.q_lora_rank) {
        Tensor qa = ws.qa.slice_rows(0, n);  // [n, Rq]
        backend_.matmul(h, L.q_a_proj, L.q_a_bias, qa);
        backend_.rms_norm(qa, L.q_a_layernorm, eps, qa);
        backend_.matmul(qa, L.q_b_proj, Tensor(), q);  // [n, H*(N+P)]
      } else {
        backend_.matmul(h, L.q_proj, Tensor(), q);     // [n, H*(N+P)]
      }
      Tensor qfull_heads = heads_major(qfull, H, P + R);  // [H, n, P+R]: per head q_pe | q_abs
      backend_.batched_matmul(heads_major(q, H, N + P), L.q_absorb, qfull_heads);
      backend_.matmul(h, L.kv_a, L.kv_a_bias, lat);  // [n, P+R]: k_pe | c_kv
      backend_.rms_norm(lat_c, L.kv_a_layernorm, eps, lat_c);
      // Rotates q_pe and k_pe (the leading P dims) and writes the latent row; V is the c_kv
      // column view of the same cache rows, so it is written twice with the same values.
      Tensor v_cache = cache.k[l].slice_cols(P, P + R);  // [blocks, bs, 1, R]
      backend_.rope_store_kv(qfull3, lat3, lat3_c, cos_sin, cfg_.rope.interleaved, b.slot_mapping,
                             cache.k[l], v_cache);
      backend_.attention(qfull3, cache.k[l], v_cache, b.attn, attn_params_, attn_lat3);
      Tensor attn_v_heads = heads_major(attn_v, H, Vd);  // [H, n, Vd] = W_UV_h [n, R] per head
      backend_.batched_matmul(heads_major(attn_lat, H, R), L.w_uv, attn_v_heads);
      backend_.matmul(attn_v, L.o_proj, L.o_bias, x);  // [n, D]
      backend_.add_rms_norm(x, residual, L.post_attention_layernorm, eps, h);
      // --- MLP ---
      if (!L.moe) {
        Tensor gate_up = ws.gate_up.slice_rows(0, n).slice_cols(0, 2 * F);
        Tensor act = ws.act.slice_rows(0, n).slice_cols(0, F);
        run_swiglu(backend_, L.mlp, h, gate_up, act, x);  // [n, D]
        continue;
      }
      Tensor shared;  // [n, D]; undefined without shared experts
      if (cfg_.n_shared_experts > 0) {
        Tensor gate_up = ws.gate_up.slice_rows(0, n).slice_cols(0, 2 * Fs);
        Tensor act = ws.act.slice_rows(0, n).slice_cols(0, Fs);
        shared = ws.shared.slice_rows(0, n);
        run_swiglu(backend_, L.shared, h, gate_up, act, shared);
      }
      // Routed experts, then + shared (transformers' order), on the device.
      moe_.run(h, L.router, L.correction_bias, L.experts, shared, x);  // [n, D]
    }
    backend_.add_rms_norm(x, residual, norm_, eps, h);
    head_.run(h, b, lm_head_, nullptr);
  }

 private:
  // q_absorb for one layer, from kv_b_proj's key rows (W_UK_h [N, R] per head): per head the
  // [P+R, N+P] block maps q_h = [q_nope | q_pe] to [q_pe | W_UK_h^T q_nope], in the activation
  // dtype (f32 on the CPU, bf16 on devices). It is built where the weights live, with backend ops
  // (dummy weights never leave the device): the [0 | I_P] rows and the zeros are copied from a
  // template, and the W_UK_h^T rows are I_R . W_UK_h^T by matmul, which copies each weight
  // exactly (one product by 1 plus zeros in an fp32 sum) and rounds it to the activation dtype
  // (kv_b_proj is bf16 on devices already, whatever float dtype the checkpoint holds). The
  // identity block copies q_pe exactly (x * 1 + 0 in fp32).
  Status build_absorbed_query(const std::string& name, DeepseekLayer& L) {
    const int64_t H = cfg_.num_attention_heads, N = cfg_.qk_nope_head_dim;
    const int64_t P = cfg_.qk_rope_head_dim, R = cfg_.kv_lora_rank, Vd = cfg_.v_head_dim;
    const Tensor& kvb = L.kv_b_proj;
    if (is_quantized(kvb.dtype)) {
      return unimplemented(cfg_.source + ": tensor '" + name + "' of type " +
                           std::string(dtype_name(kvb.dtype)) +
                           " cannot be absorbed (MLA needs an f32/f16/bf16 kv_b_proj)");
    }
    const DType dt = backend_.activation_dtype();
    const int64_t block = (P + R) * (N + P);  // elements of one head's block
    const int64_t bytes = dtype_bytes(dt, H * block);
    if (!absorb_template_) {  // made once per load, freed at its end
      std::vector<float> t(H * block, 0.0f), eye(R * R, 0.0f);
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t i = 0; i < P; ++i) t[hd * block + i * (N + P) + N + i] = 1.0f;
      for (int64_t i = 0; i < R; ++i) eye[i * R + i] = 1.0f;
      std::vector<uint8_t> staged(bytes);
      from_f32(dt, t.data(), staged.data(), H * block);
      absorb_template_ = backend_.allocate(bytes);
      backend_.copy_from_host(absorb_template_->data(), staged.data(), bytes);
      staged.resize(dtype_bytes(dt, R * R));
      from_f32(dt, eye.data(), staged.data(), R * R);
      absorb_identity_ = backend_.allocate(dtype_bytes(dt, R * R));
      backend_.copy_from_host(absorb_identity_->data(), staged.data(), dtype_bytes(dt, R * R));
    }
    auto buf = backend_.allocate(bytes);
    backend_.copy(buf->data(), absorb_template_->data(), bytes);
    Tensor A = buf->view(dt, {H, P + R, N + P});
    const Tensor eye = absorb_identity_->view(dt, {R, R});
    for (int64_t hd = 0; hd < H; ++hd) {
      // Rows [P, P+R) x columns [0, N) of head hd's block: W_UK_h^T [R, N], row stride N+P.
      Tensor uk_t(static_cast<char*>(buf->data()) + dtype_bytes(dt, hd * block + P * (N + P)), dt,
                  {R, N}, backend_.device());
      uk_t.stride = {N + P, 1, 0, 0};
      backend_.matmul(eye, kvb.slice_rows(hd * (N + Vd), hd * (N + Vd) + N), Tensor(), uk_t);
    }
    L.q_absorb = A;
    absorb_storage_.push_back(std::move(buf));
    return {};
  }

  void reserve(int64_t n) {
    Workspace& ws = ws_;
    const DType dt = backend_.activation_dtype();
    const int64_t D = cfg_.hidden_size, H = cfg_.num_attention_heads;
    const int64_t N = cfg_.qk_nope_head_dim, P = cfg_.qk_rope_head_dim, R = cfg_.kv_lora_rank;
    const int64_t Vd = cfg_.v_head_dim;
    const int64_t Rq = cfg_.q_lora_rank.value_or(1);
    const int64_t F = std::max(cfg_.intermediate_size,
                               cfg_.moe_intermediate_size * std::max<int64_t>(cfg_.n_shared_experts, 1));
    if (n > ws.capacity_tokens) {
      const int64_t cap = std::max<int64_t>(n, 16);
      ws.buf = allocate_scratch(
          backend_, cap,
          {{&ws.x, dt, D}, {&ws.residual, dt, D}, {&ws.h, dt, D}, {&ws.qa, dt, Rq},
           {&ws.q, dt, H * (N + P)}, {&ws.lat, dt, P + R}, {&ws.qfull, dt, H * (P + R)},
           {&ws.attn_lat, dt, H * R}, {&ws.attn_v, dt, H * Vd}, {&ws.gate_up, dt, 2 * F},
           {&ws.act, dt, F}, {&ws.shared, dt, D}, {&ws.cos_sin, DType::kF32, P}});
      ws.capacity_tokens = cap;
    }
    moe_.reserve(n);
  }

  // RoPE table for this step's positions (yarn is position-only, so no per-sequence length).
  Tensor upload_cos_sin(const StepBatch& b) {
    return rope_.upload_step_table(b.positions, b.cu_seqlens_q, backend_, ws_.cos_sin);
  }

  RotaryEmbedding rope_;
  AttentionParams attn_params_;
  MoeBlock moe_;
  std::vector<DeepseekLayer> layers_;
  std::vector<std::unique_ptr<Buffer>> storage_, absorb_storage_;
  std::unique_ptr<Buffer> absorb_template_, absorb_identity_;  // load-time scratch of q_absorb
  Workspace ws_;
};

Result<std::unique_ptr<Model>> make_deepseek(const LoadedCheckpoint& ckpt, Backend& backend,
                                             const LoadOptions& opt) {
  const ModelConfig& c = ckpt.config;
  if (c.kv_lora_rank <= 0 || c.n_routed_experts <= 0) {
    return invalid_argument(c.source + ": " + c.architecture +
                            " needs kv_lora_rank and n_routed_experts");
  }
  auto m = std::make_unique<DeepseekModel>(c, backend);
  PAGELLM_RETURN_IF_ERROR(m->load(*ckpt.weights, opt));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

void register_deepseek_v2() {
  for (const char* name : {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
    register_architecture(name, make_deepseek);
}

}  // namespace pagellm
