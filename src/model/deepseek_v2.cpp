// DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): pre-norm decoder with
// multi-head latent attention (MLA) and DeepSeekMoE (routed + shared experts; the first
// first_k_dense_replace layers use a dense MLP). Weight names are Hugging Face's, verbatim.
//
// MLA keeps one latent row per token in the KV cache: [k_pe (rope dim P) | c_kv (kv_lora_rank R)],
// where c_kv = kv_a_layernorm(kv_a_proj_with_mqa(h)[:R]) and k_pe is the rotated shared key. The
// per-head keys and values of the cached context are never materialized: decodes and continued
// prefills attend in the absorbed form, with W_UK (the key half of kv_b_proj) folded into the
// query, as one "head" of dim P + R against the latent row:
//   q_abs_h = W_UK_h^T q_nope_h                         [R]
//   score   = (q_pe_h . k_pe + q_abs_h . c_kv) * scale
//   o_h     = W_UV_h (softmax . c_kv)                   [v_head_dim]
// which is the same sum as transformers' expanded form (only summation order differs). The latent
// cache is the attention op's K (dim P + R) and, as a column view of the same rows, its V (dim R).
// The row puts k_pe first because the rope op rotates the leading dims of each head; for the same
// reason q_proj (or q_b_proj) is loaded with each head's rows reordered to [q_pe | q_nope]. The
// per-head products (q_h -> [q_pe | q_abs_h], W_UV_h) are one batched matmul each over the heads
// (a strided batched GEMM on devices); q_absorb is built where the weights live, from kv_b_proj, by
// backend ops, so the CPU golden tests check the same op sequence the GPU runs.
//
// Fresh prompts take the expanded form instead (transformers' own): a prompt's context is exactly
// its own tokens, whose latent rows are in the step's buffer, so their per-head keys
// [k_pe | W_UK_h c_kv] (dim P + N) and values W_UV_h c_kv are made by two batched matmuls and run
// through the ordinary attention op (the tensor-core prefill kernel on devices, dims 192 / 128 for
// V2 and V3) with q_h = [q_pe | q_nope] as it comes out of the projection. The absorbed form costs
// (P + R) + R multiply-adds per head and key pair against (P + N) + Vd for the expanded one, and
// has no tensor-core kernel; at decode the expanded form would re-expand the whole context every
// step. So each step splits: the scheduler puts decodes and continued prefills first and newly
// admitted prompts last, and the trailing run of prompts starting at position 0 is expanded
// (mla_split below) while the rest stays absorbed. Decode-shaped steps (the ones CUDA graphs
// record) never split.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/log.h"
#include "model/decoder_model.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/scratch.h"
#include "model/weight_loader.h"

namespace pagellm {
namespace {

struct DeepseekLayer {
  Tensor input_layernorm, post_attention_layernorm;  // [D]
  Tensor q_proj;                    // [H*(P+N), D] (no q_lora_rank), head rows q_pe then q_nope
  Tensor q_a_proj, q_a_bias;        // [Rq, D], [Rq]
  Tensor q_a_layernorm;             // [Rq]
  Tensor q_b_proj;                  // [H*(P+N), Rq], rows ordered as q_proj
  Tensor kv_a, kv_a_bias;           // kv_a_proj_with_mqa, rows reordered to k_pe | c_kv: [P+R, D]
  // q_proj (or q_a_proj) and kv_a stacked by rows, when the model fuses them (q_proj / q_a_proj
  // and kv_a are then row views of it): [Qd + P+R, D], Qd = H*(P+N) or Rq.
  Tensor q_kv_a;
  Tensor kv_a_layernorm;            // [R]
  Tensor kv_b_proj;                 // [H*(N+V), R]
  Tensor q_absorb;                  // act [H, P+R, P+N]: per head [[I_P | 0], [0 | W_UK_h^T]]
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
  Tensor x, residual, h, q, qfull, attn_lat, attn_v, gate_up, act, shared;
  // [cap, Qd + P+R]: the query projection's output (q, or q_a with q_lora_rank) and the latent
  // row k_pe | c_kv, as proj_views lays them out (column slices of each row when one product
  // writes both, else two blocks); q is then q_b_proj's output (q_lora_rank only).
  Tensor q_lat;
  Tensor kv_exp;  // [cap, H*(P+N+Vd)]: expanded keys | values, heads-major per step
  Tensor cos_sin;                  // f32 [cap, P]
  Tensor eh;                       // an MTP module's [cap, 2D]: enorm(embedding) | hnorm(hidden)
};

// How a step's sequences divide between the two forms of attention (see the top of the file):
// sequences [0, s0) and their tokens [0, n_abs) absorbed, the rest expanded.
struct MlaSplit {
  int32_t s0 = 0, n_abs = 0;
  int32_t max_q_abs = 0, max_q_exp = 0;  // longest query run of each part
  int64_t exp_qk_pairs = 0;              // causal (query, key) pairs of the expanded part
  bool expanded() const { return max_q_exp > 0; }
};

MlaSplit mla_split(const StepBatch& b) {
  MlaSplit sp;
  const int32_t n_seqs = b.attn.n_seqs;
  sp.s0 = n_seqs;
  sp.n_abs = b.n_tokens;
  const std::vector<int32_t>& cu = b.cu_seqlens_q;
  if (static_cast<int32_t>(cu.size()) != n_seqs + 1 ||
      b.positions.size() != static_cast<size_t>(b.n_tokens))
    return sp;  // no host copies: keep everything absorbed
  int32_t max_q = 0;
  for (int32_t s = 0; s < n_seqs; ++s) max_q = std::max(max_q, cu[s + 1] - cu[s]);
  if (max_q <= 1) return sp;  // decode-shaped: recorded as a graph, never split
  while (sp.s0 > 0) {
    const int32_t s = sp.s0 - 1, n_q = cu[s + 1] - cu[s];
    if (n_q < 1 || b.positions[cu[s]] != 0) break;  // not a prompt starting this step
    --sp.s0;
    sp.max_q_exp = std::max(sp.max_q_exp, n_q);
    sp.exp_qk_pairs += static_cast<int64_t>(n_q) * (n_q + 1) / 2;
  }
  sp.n_abs = cu[sp.s0];
  for (int32_t s = 0; s < sp.s0; ++s) sp.max_q_abs = std::max(sp.max_q_abs, cu[s + 1] - cu[s]);
  return sp;
}

// Head h of an activation [n, heads * dim] as entry h of a [heads, n, dim] view: batched_matmul's
// operand for per-head products (batch stride dim, row stride the activation's).
Tensor heads_major(const Tensor& t, int64_t heads, int64_t dim) {
  return t.split_heads(heads, dim).transpose01();
}

// The decoder, or, made with the loaded decoder as `target`, the checkpoint's first
// multi-token-prediction layer as an MTP module (model.h's MtpModule): model.layers.<L>.* for L
// = num_hidden_layers, a decoder layer like the others, whose input is
//   eh_proj [enorm(embedding of token j + 1) | hnorm(hidden row j)]
// and whose output goes through shared_head.norm to the LM head. The module's embedding table
// and LM head are the target's: DeepSeek-V3 shares them between the model and its MTP module
// (the checkpoint's copies under the MTP layer are not loaded).
class DeepseekModel final : public DecoderModel {
 public:
  DeepseekModel(const ModelConfig& cfg, Backend& backend, const DeepseekModel* target = nullptr)
      : DecoderModel(cfg, backend), rope_(cfg), moe_(backend, cfg), mtp_(target != nullptr) {
    if (target) {
      embed_tokens_ = target->embed_tokens_;
      lm_head_ = target->lm_head_;
    }
  }

  KvSpec kv_spec() const override {
    return {mtp_ ? 1 : cfg_.num_hidden_layers, 1, cfg_.qk_rope_head_dim + cfg_.kv_lora_rank, 0};
  }
  // The MTP module's bytes a step reads: its layer and the shared LM head it does not hold.
  int64_t decode_weight_bytes() const override {
    if (!mtp_) return DecoderModel::decode_weight_bytes();
    return weight_bytes_ + dtype_bytes(lm_head_.dtype, lm_head_.numel()) - unrouted_expert_bytes_;
  }
  Tensor last_hidden() const override { return ws_.h; }  // what the LM head read
  void set_hidden_input(const Tensor& rows) {
    PAGELLM_CHECK(mtp_ && rows.cols() == cfg_.hidden_size);
    hidden_in_ = rows;
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
    // The checkpoint's index of layers_[0], and the layers loaded.
    const int64_t first = mtp_ ? cfg_.num_hidden_layers : 0;
    const int64_t n_layers = mtp_ ? 1 : cfg_.num_hidden_layers;
    if (!mtp_) {
      PAGELLM_RETURN_IF_ERROR(ld.embeddings_and_head(cfg_, embed_tokens_, norm_, lm_head_));
      if (cfg_.num_nextn_predict_layers > 0) {
        PAGELLM_LOG_INFO(
            "%s: skipping %lld multi-token-prediction layer(s) (model.layers.%lld.*): "
            "--speculative-method mtp runs the first",
            cfg_.source.c_str(), static_cast<long long>(cfg_.num_nextn_predict_layers),
            static_cast<long long>(cfg_.num_hidden_layers));
      }
    } else {
      const std::string p = "model.layers." + std::to_string(first) + ".";
      PAGELLM_RETURN_IF_ERROR(vec(p + "shared_head.norm.weight", D, 1.0f, norm_));
      PAGELLM_RETURN_IF_ERROR(vec(p + "enorm.weight", D, 1.0f, enorm_));
      PAGELLM_RETURN_IF_ERROR(vec(p + "hnorm.weight", D, 1.0f, hnorm_));
      PAGELLM_RETURN_IF_ERROR(ld.matrix_into(p + "eh_proj.weight", {D, 2 * D}, eh_proj_));
      if (cfg_.num_nextn_predict_layers > 1) {
        PAGELLM_LOG_INFO("%s: the MTP module chains its first layer; the other %lld are not run",
                         cfg_.source.c_str(),
                         static_cast<long long>(cfg_.num_nextn_predict_layers - 1));
      }
    }
    // Each head's query rows come as q_nope (N) then q_pe (P); loaded as q_pe then q_nope, so the
    // rope op rotates the head's leading P dims and the expanded form uses q as it is.
    WeightLoader::RowRanges pe_first_heads;
    for (int64_t hd = 0; hd < H; ++hd) {
      pe_first_heads.push_back({hd * (N + P) + N, (hd + 1) * (N + P)});
      pe_first_heads.push_back({hd * (N + P), hd * (N + P) + N});
    }
    // The checkpoint's rows of kv_a are c_kv (R) then k_pe (P); the cache row is k_pe | c_kv.
    const WeightLoader::RowRanges pe_first = {{R, R + P}, {0, R}};
    // The query projection (q_proj, or q_a_proj with q_lora_rank) and kv_a both read the
    // normalized rows: stacked, one product writes both (at decode one GEMV instead of two, kv_a's
    // 576 rows alone streaming at a quarter of the copy rate: docs/perf-history "Eighth round").
    // Not with biases (attention_bias: kv_a's would need a zero q part), nor where weights stay
    // quantized (the CPU's GGUF blocks: stacking keeps each tensor whole).
    const int64_t Qd = query_rows();
    const auto q_name = [&](const std::string& a) {
      return a + (cfg_.q_lora_rank ? "q_a_proj.weight" : "q_proj.weight");
    };
    fuse_q_kv_a_ = !cfg_.attention_bias;
    for (int64_t i = first; i < first + n_layers; ++i) {
      const std::string a = "model.layers." + std::to_string(i) + ".self_attn.";
      if (ld.stays_quantized(q_name(a)) || ld.stays_quantized(a + "kv_a_proj_with_mqa.weight"))
        fuse_q_kv_a_ = false;
    }
    layers_.resize(n_layers);
    for (int64_t i = first; i < first + n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const std::string a = p + "self_attn.";
      DeepseekLayer& L = layers_[i - first];
      if (fuse_q_kv_a_) {
        PAGELLM_ASSIGN_OR_RETURN(
            L.q_kv_a,
            ld.stacked_matrix(
                {{q_name(a), Qd, cfg_.q_lora_rank ? WeightLoader::RowRanges{} : pe_first_heads},
                 {a + "kv_a_proj_with_mqa.weight", R + P, pe_first}},
                D));
        (cfg_.q_lora_rank ? L.q_a_proj : L.q_proj) = L.q_kv_a.slice_rows(0, Qd);
        L.kv_a = L.q_kv_a.slice_rows(Qd, Qd + P + R);
      }
      PAGELLM_RETURN_IF_ERROR(vec(p + "input_layernorm.weight", D, 1.0f, L.input_layernorm));
      PAGELLM_RETURN_IF_ERROR(
          vec(p + "post_attention_layernorm.weight", D, 1.0f, L.post_attention_layernorm));
      if (cfg_.q_lora_rank) {
        const int64_t Rq = *cfg_.q_lora_rank;
        if (!fuse_q_kv_a_)
          PAGELLM_RETURN_IF_ERROR(ld.matrix_into(a + "q_a_proj.weight", {Rq, D}, L.q_a_proj));
        if (cfg_.attention_bias)
          PAGELLM_RETURN_IF_ERROR(vec(a + "q_a_proj.bias", Rq, 0.0f, L.q_a_bias));
        PAGELLM_RETURN_IF_ERROR(vec(a + "q_a_layernorm.weight", Rq, 1.0f, L.q_a_layernorm));
        PAGELLM_ASSIGN_OR_RETURN(
            L.q_b_proj,
            ld.reordered_matrix(a + "q_b_proj.weight", {H * (N + P), Rq}, pe_first_heads));
      } else if (!fuse_q_kv_a_) {
        PAGELLM_ASSIGN_OR_RETURN(
            L.q_proj, ld.reordered_matrix(a + "q_proj.weight", {H * (N + P), D}, pe_first_heads));
      }
      if (!fuse_q_kv_a_) {
        PAGELLM_ASSIGN_OR_RETURN(
            L.kv_a, ld.reordered_matrix(a + "kv_a_proj_with_mqa.weight", {R + P, D}, pe_first));
      }
      if (cfg_.attention_bias) {
        PAGELLM_ASSIGN_OR_RETURN(
            L.kv_a_bias, ld.reordered_vector(a + "kv_a_proj_with_mqa.bias", R + P, 0.0f, pe_first));
      }
      PAGELLM_RETURN_IF_ERROR(vec(a + "kv_a_layernorm.weight", R, 1.0f, L.kv_a_layernorm));
      PAGELLM_ASSIGN_OR_RETURN(L.kv_b_proj,
                               ld.float_matrix(a + "kv_b_proj.weight", {H * (N + Vd), R}));
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

  void prepare(const StepBatch& b) override {
    reserve(b.n_tokens);
    upload_cos_sin(b);
    split_ = mla_split(b);
    if (split_.expanded()) upload_expanded_meta(b, split_);
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
    const int64_t Qd = query_rows();
    ProjViews q_lat = proj_views(ws.q_lat, n, {Qd, P + R}, fuse_q_kv_a_);
    Tensor qa = q_lat.part[0];  // [n, Rq] with q_lora_rank
    // [n, H*(P+N)]: per head q_pe | q_nope
    Tensor q = cfg_.q_lora_rank ? ws.q.slice_rows(0, n) : q_lat.part[0];
    Tensor lat = q_lat.part[1];                      // [n, P+R]: k_pe | c_kv
    Tensor attn_v = ws.attn_v.slice_rows(0, n);      // [n, H*Vd]
    Tensor lat_c = lat.slice_cols(P, P + R);         // [n, R]
    Tensor lat3 = lat.split_heads(1, P + R);         // [n, 1, P+R]
    Tensor lat3_c = lat3.slice_cols(P, P + R);       // [n, 1, R]
    Tensor q3 = q.split_heads(H, P + N);             // [n, H, P+N]
    Tensor cos_sin = ws.cos_sin.slice_rows(0, n);  // f32 [n, P], uploaded by prepare()
    // Tokens [0, na) attend in the absorbed form, [na, n) (fresh prompts) in the expanded one.
    const MlaSplit& sp = split_;  // planned by prepare() for this batch
    const int64_t na = sp.n_abs;
    const AttentionMeta meta_abs = sp.expanded() ? absorbed_meta(b, sp) : b.attn;
    const AttentionMeta meta_exp = sp.expanded() ? expanded_meta(b, sp) : AttentionMeta{};
    Tensor qfull = ws.qfull.slice_rows(0, na);  // [na, H*(P+R)]: per head q_pe | q_abs
    Tensor qfull3 = qfull.reshape({na, H, P + R});
    Tensor attn_lat3 = ws.attn_lat.slice_rows(0, na).reshape({na, H, R});
    Tensor attn_v_exp3 = attn_v.slice_rows(na, n).reshape({n - na, H, Vd});

    if (mtp_) {  // the layer's input: eh_proj [enorm(embedding) | hnorm(hidden row)]
      const int64_t D = cfg_.hidden_size;
      PAGELLM_CHECK_MSG(hidden_in_.defined() && hidden_in_.rows() >= n,
                        "an MTP forward without its hidden rows");
      Tensor eh = ws.eh.slice_rows(0, n);  // [n, 2D]
      Tensor e = eh.slice_cols(0, D), hh = eh.slice_cols(D, 2 * D);
      backend_.embedding(embed_tokens_, b.token_ids, h);
      backend_.rms_norm(h, enorm_, eps, e);
      backend_.rms_norm(hidden_in_.slice_rows(0, n), hnorm_, eps, hh);
      backend_.matmul(eh, eh_proj_, Tensor(), residual);
    } else {
      backend_.embedding(embed_tokens_, b.token_ids, residual);  // [n, D]
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DeepseekLayer& L = layers_[l];
      if (l == 0) {
        backend_.rms_norm(residual, L.input_layernorm, eps, h);
      } else {
        backend_.add_rms_norm(x, residual, L.input_layernorm, eps, h);  // x: previous MLP out
      }
      // --- MLA ---
      if (fuse_q_kv_a_) {
        backend_.matmul(h, L.q_kv_a, Tensor(), q_lat.all);  // q (or q_a) | k_pe | c_kv
      } else {
        // q_proj has no bias (q_a_bias is undefined without q_lora_rank).
        backend_.matmul(h, cfg_.q_lora_rank ? L.q_a_proj : L.q_proj, L.q_a_bias, q_lat.part[0]);
        backend_.matmul(h, L.kv_a, L.kv_a_bias, lat);  // [n, P+R]: k_pe | c_kv
      }
      if (cfg_.q_lora_rank) {
        backend_.rms_norm(qa, L.q_a_layernorm, eps, qa);
        backend_.matmul(qa, L.q_b_proj, Tensor(), q);  // [n, H*(P+N)]
      }
      // Absorbed: q_h -> [q_pe | q_abs_h] against the latent cache (q_absorb copies q_pe exactly:
      // an identity block), then W_UV_h after attention. When every token attends that way the
      // product runs as a side branch beside the latent norm, on q_pe not yet rotated, and RoPE
      // rotates the copy instead: the same values, one latency-bound kernel fewer on the chain.
      Tensor qfull_heads = heads_major(qfull, H, P + R);  // [H, na, P+R]
      const auto absorb_q = [&] {
        backend_.batched_matmul(heads_major(q.slice_rows(0, na), H, P + N), L.q_absorb,
                                qfull_heads);
      };
      const bool absorb_beside = na == n;
      if (absorb_beside) {
        backend_.begin_side();
        absorb_q();
        backend_.end_side();
      }
      backend_.rms_norm(lat_c, L.kv_a_layernorm, eps, lat_c);
      if (absorb_beside) backend_.join_side();
      // Rotates q_pe and k_pe (the leading P dims) and writes the latent row; V is the c_kv
      // column view of the same cache rows, so it is written twice with the same values.
      Tensor v_cache = cache.k[l].slice_cols(P, P + R);  // [blocks, bs, 1, R]
      // (An FP8 latent row has one scale: V is the same bytes as K's c_kv part.)
      backend_.rope_store_kv(absorb_beside ? qfull3 : q3, lat3, lat3_c, cos_sin,
                             cfg_.rope.interleaved, b.slot_mapping, cache.k[l], v_cache,
                             cache.k_scale(l), cache.k_scale(l));
      if (na > 0) {
        if (!absorb_beside) absorb_q();
        Tensor attn_v_abs = attn_v.slice_rows(0, na).split_heads(H, Vd);  // [na, H, Vd]
        AttentionParams ap = cache.params(l, attn_params_);
        ap.v_scale = ap.k_scale;
        backend_.attention_project(qfull3, cache.k[l], v_cache, meta_abs, ap, L.w_uv, attn_lat3,
                                   attn_v_abs);
      }
      if (sp.expanded()) {  // expanded: per-head keys and values of the fresh prompts
        // From the latent rows as an FP8 cache holds them: what later steps read back.
        Tensor lat_exp = lat.slice_rows(na, n);
        if (cache.k[l].dtype == DType::kF8E4M3)
          backend_.round_to_fp8_cache(lat_exp, cache.k_scale(l));
        const auto [k_exp, v_exp] = expand_kv(L, lat_exp);
        backend_.attention(q3.slice_rows(na, n), k_exp, v_exp, meta_exp, attn_params_, attn_v_exp3);
      }
      backend_.matmul(attn_v, L.o_proj, L.o_bias, x);  // [n, D]
      backend_.add_rms_norm(x, residual, L.post_attention_layernorm, eps, h);
      // --- MLP ---
      if (!L.moe) {
        Tensor gate_up = ws.gate_up.slice_rows(0, n).slice_cols(0, 2 * F);
        Tensor act = ws.act.slice_rows(0, n).slice_cols(0, F);
        run_swiglu(backend_, L.mlp, h, gate_up, act, x);  // [n, D]
        continue;
      }
      // The router and its top-k, a chain of small latency-bound kernels, run as a side branch
      // beside the shared experts' products (both only read h).
      backend_.begin_side();
      moe_.route(h, L.router, L.correction_bias);
      backend_.end_side();
      Tensor shared;  // [n, D]; undefined without shared experts
      if (cfg_.n_shared_experts > 0) {
        Tensor gate_up = ws.gate_up.slice_rows(0, n).slice_cols(0, 2 * Fs);
        Tensor act = ws.act.slice_rows(0, n).slice_cols(0, Fs);
        shared = ws.shared.slice_rows(0, n);
        run_swiglu(backend_, L.shared, h, gate_up, act, shared);
      }
      backend_.join_side();
      // Routed experts, then + shared (transformers' order), on the device.
      moe_.experts(h, L.experts, shared, x);  // [n, D]
    }
    backend_.add_rms_norm(x, residual, norm_, eps, h);
    head_.run(h, b, lm_head_, nullptr);
  }

 private:
  // q_absorb for one layer, from kv_b_proj's key rows (W_UK_h [N, R] per head): per head the
  // [P+R, P+N] block maps q_h = [q_pe | q_nope] to [q_pe | W_UK_h^T q_nope], in the activation
  // dtype (f32 on the CPU, bf16 on devices). It is built where the weights live, with backend ops
  // (dummy weights never leave the device): the [I_P | 0] rows and the zeros are copied from a
  // template, and the W_UK_h^T rows are I_R . W_UK_h^T by matmul, which copies each weight
  // exactly (one product by 1 plus zeros in an fp32 sum) and rounds it to the activation dtype
  // (kv_b_proj is bf16 on devices already, whatever float dtype the checkpoint holds). The
  // identity block copies q_pe exactly (x * 1 + 0 in fp32). Made with the template: eye_p_storage_,
  // I_P per head, the weight that copies k_pe into every head of the expanded keys.
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
        for (int64_t i = 0; i < P; ++i) t[hd * block + i * (N + P) + i] = 1.0f;
      for (int64_t i = 0; i < R; ++i) eye[i * R + i] = 1.0f;
      std::vector<uint8_t> staged(bytes);
      from_f32(dt, t.data(), staged.data(), H * block);
      PAGELLM_ASSIGN_OR_RETURN(absorb_template_,
                               backend_.allocate_or_error(bytes, "the absorbed query's template"));
      backend_.copy_from_host(absorb_template_->data(), staged.data(), bytes);
      staged.resize(dtype_bytes(dt, R * R));
      from_f32(dt, eye.data(), staged.data(), R * R);
      PAGELLM_ASSIGN_OR_RETURN(
          absorb_identity_,
          backend_.allocate_or_error(dtype_bytes(dt, R * R), "the absorbed query's identity"));
      backend_.copy_from_host(absorb_identity_->data(), staged.data(), dtype_bytes(dt, R * R));
      // One I_P per head (no batch stride of 0 on the weight side: the batched GEMMs are tested
      // with shared inputs, and the copy is 2 H P^2 bytes).
      std::vector<float> eye_p(H * P * P, 0.0f);
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t i = 0; i < P; ++i) eye_p[(hd * P + i) * P + i] = 1.0f;
      staged.resize(dtype_bytes(dt, H * P * P));
      from_f32(dt, eye_p.data(), staged.data(), H * P * P);
      PAGELLM_ASSIGN_OR_RETURN(
          eye_p_storage_,
          backend_.allocate_or_error(dtype_bytes(dt, H * P * P), "the rotary keys' copy weight"));
      backend_.copy_from_host(eye_p_storage_->data(), staged.data(), dtype_bytes(dt, H * P * P));
    }
    PAGELLM_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf,
                             backend_.allocate_or_error(bytes, "'" + name + "' absorbed"));
    backend_.copy(buf->data(), absorb_template_->data(), bytes);
    Tensor A = buf->view(dt, {H, P + R, N + P});
    const Tensor eye = absorb_identity_->view(dt, {R, R});
    for (int64_t hd = 0; hd < H; ++hd) {
      // Rows [P, P+R) x columns [P, P+N) of head hd's block: W_UK_h^T [R, N], row stride P+N.
      Tensor uk_t(static_cast<char*>(buf->data()) + dtype_bytes(dt, hd * block + P * (N + P) + P),
                  dt, {R, N}, backend_.device());
      uk_t.stride = {N + P, 1, 0, 0};
      backend_.matmul(eye, kvb.slice_rows(hd * (N + Vd), hd * (N + Vd) + N), Tensor(), uk_t);
    }
    L.q_absorb = A;
    absorb_storage_.push_back(std::move(buf));
    return {};
  }

  // The expanded keys and values of the step's trailing fresh prompts (tokens [sp.n_abs, n)),
  // heads-major in ws.kv_exp: head h's panel [T, P+N+Vd] holds per token [k_pe | W_UK_h c_kv |
  // W_UV_h c_kv]. Returns the panel views as the attention op's caches: K [T, 1, H, P+N] and V
  // [T, 1, H, Vd], one token per "block" (block tables from upload_expanded_meta).
  std::pair<Tensor, Tensor> expand_kv(const DeepseekLayer& L, const Tensor& lat_exp) {
    const int64_t H = cfg_.num_attention_heads, N = cfg_.qk_nope_head_dim;
    const int64_t P = cfg_.qk_rope_head_dim, R = cfg_.kv_lora_rank, Vd = cfg_.v_head_dim;
    const int64_t T = lat_exp.rows(), W = P + N + Vd;
    const DType dt = backend_.activation_dtype();
    auto panels = [&](int64_t col, int64_t width) {  // [H, T, width] at column col of the panels
      Tensor t(static_cast<char*>(ws_.kv_exp.data) + dtype_bytes(dt, col), dt, {H, T, width},
               backend_.device());
      t.stride = {T * W, W, 1, 0};
      return t;
    };
    auto every_head = [&](const Tensor& x) {  // [T, k] as [H, T, k] with batch stride 0
      Tensor t = x;
      t.ndim = 3;
      t.shape = {H, x.rows(), x.cols(), 1};
      t.stride = {0, x.row_stride(), 1, 0};
      return t;
    };
    Tensor kvb_heads = L.kv_b_proj;  // [H, N+Vd, R]: W_UK_h then W_UV_h
    kvb_heads.ndim = 3;
    kvb_heads.shape = {H, N + Vd, R, 1};
    kvb_heads.stride = {(N + Vd) * R, R, 1, 0};
    Tensor eye_heads = eye_p_storage_->view(dt, {H, P, P});
    Tensor k_pe = panels(0, P), kv_nope_v = panels(P, N + Vd);
    backend_.batched_matmul(every_head(lat_exp.slice_cols(0, P)), eye_heads, k_pe);  // exact copy
    backend_.batched_matmul(every_head(lat_exp.slice_cols(P, P + R)), kvb_heads, kv_nope_v);
    auto cache_view = [&](int64_t col, int64_t width) {
      Tensor t(static_cast<char*>(ws_.kv_exp.data) + dtype_bytes(dt, col), dt, {T, 1, H, width},
               backend_.device());
      t.stride = {W, W, T * W, 1};
      return t;
    };
    return {cache_view(0, P + N), cache_view(P + N, Vd)};
  }

  // The expanded part's attention metadata, made on the host and uploaded by prepare():
  // cu_seqlens_q from 0, seq_lens_kv = the prompts' lengths, block tables (block size 1) naming
  // each prompt's rows of the panels. Views of the uploaded buffer.
  AttentionMeta expanded_meta(const StepBatch& b, const MlaSplit& sp) const {
    const int32_t n_e = b.attn.n_seqs - sp.s0;
    const int32_t* base = static_cast<const int32_t*>(exp_meta_->data());
    const Device dev = backend_.device();
    AttentionMeta m;
    m.n_seqs = n_e;
    m.cu_seqlens_q = Tensor(const_cast<int32_t*>(base), DType::kI32, {n_e + 1}, dev);
    m.seq_lens_kv = Tensor(const_cast<int32_t*>(base + n_e + 1), DType::kI32, {n_e}, dev);
    m.block_tables =
        Tensor(const_cast<int32_t*>(base + 2 * n_e + 1), DType::kI32, {n_e, sp.max_q_exp}, dev);
    m.block_size = 1;
    m.max_seqlen_q = m.max_seqlen_kv = sp.max_q_exp;
    m.total_kv_tokens = b.n_tokens - sp.n_abs;  // a fresh prompt's keys are its tokens
    m.total_qk_pairs = sp.exp_qk_pairs;
    return m;
  }
  void upload_expanded_meta(const StepBatch& b, const MlaSplit& sp) {
    const int32_t n_e = b.attn.n_seqs - sp.s0, w = sp.max_q_exp;
    std::vector<int32_t> host(static_cast<size_t>(2 * n_e + 1) + static_cast<size_t>(n_e) * w, 0);
    for (int32_t i = 0; i <= n_e; ++i) host[i] = b.cu_seqlens_q[sp.s0 + i] - sp.n_abs;
    for (int32_t i = 0; i < n_e; ++i) {
      const int32_t first = host[i], len = host[i + 1] - host[i];
      host[n_e + 1 + i] = len;
      for (int32_t j = 0; j < len; ++j)
        host[2 * n_e + 1 + static_cast<size_t>(i) * w + j] = first + j;
    }
    const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(int32_t));
    if (!exp_meta_ || exp_meta_bytes_ < bytes) {
      exp_meta_bytes_ = std::max<int64_t>(bytes, 2 * exp_meta_bytes_);
      exp_meta_ = backend_.must_allocate(exp_meta_bytes_, "the expanded attention metadata");
    }
    backend_.copy_from_host(exp_meta_->data(), host.data(), bytes);
  }

  // The absorbed part's metadata: the step's, cut to its first sp.s0 sequences.
  static AttentionMeta absorbed_meta(const StepBatch& b, const MlaSplit& sp) {
    AttentionMeta m = b.attn;
    m.n_seqs = sp.s0;
    m.cu_seqlens_q = b.attn.cu_seqlens_q.slice_rows(0, sp.s0 + 1);
    m.seq_lens_kv = b.attn.seq_lens_kv.slice_rows(0, sp.s0);
    m.block_tables = b.attn.block_tables.slice_rows(0, sp.s0);
    m.max_seqlen_q = sp.max_q_abs;
    m.total_kv_tokens = std::max<int64_t>(0, b.attn.total_kv_tokens - (b.n_tokens - sp.n_abs));
    m.total_qk_pairs = std::max<int64_t>(0, b.attn.total_qk_pairs - sp.exp_qk_pairs);
    return m;
  }

  void reserve(int64_t n) {
    Workspace& ws = ws_;
    const DType dt = backend_.activation_dtype();
    const int64_t D = cfg_.hidden_size, H = cfg_.num_attention_heads;
    const int64_t N = cfg_.qk_nope_head_dim, P = cfg_.qk_rope_head_dim, R = cfg_.kv_lora_rank;
    const int64_t Vd = cfg_.v_head_dim;
    const int64_t Qd = query_rows();
    const int64_t F = std::max(cfg_.intermediate_size,
                               cfg_.moe_intermediate_size * std::max<int64_t>(cfg_.n_shared_experts, 1));
    if (n > ws.capacity_tokens) {
      const int64_t cap = std::max<int64_t>(n, 16);
      ws.buf = allocate_scratch(backend_, cap,
                                {{&ws.x, dt, D},
                                 {&ws.residual, dt, D},
                                 {&ws.h, dt, D},
                                 {&ws.q, dt, cfg_.q_lora_rank ? H * (N + P) : 0},
                                 {&ws.q_lat, dt, Qd + P + R},
                                 {&ws.qfull, dt, H * (P + R)},
                                 {&ws.attn_lat, dt, H * R},
                                 {&ws.attn_v, dt, H * Vd},
                                 {&ws.gate_up, dt, 2 * F},
                                 {&ws.act, dt, F},
                                 {&ws.shared, dt, D},
                                 {&ws.kv_exp, dt, H * (P + N + Vd)},
                                 {&ws.eh, dt, mtp_ ? 2 * D : 0},
                                 {&ws.cos_sin, DType::kF32, P}});
      ws.capacity_tokens = cap;
    }
    moe_.reserve(n);
  }

  // Rows of the query projection that reads the normalized input: q_proj's H*(P+N), or
  // q_a_proj's q_lora_rank.
  int64_t query_rows() const {
    return cfg_.q_lora_rank
               ? *cfg_.q_lora_rank
               : cfg_.num_attention_heads * (cfg_.qk_nope_head_dim + cfg_.qk_rope_head_dim);
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
  std::unique_ptr<Buffer> eye_p_storage_;                      // [H, P, P]: I_P per head
  std::unique_ptr<Buffer> exp_meta_;                           // expanded_meta's device copy
  int64_t exp_meta_bytes_ = 0;
  MlaSplit split_;  // the prepared step's split between the two forms (compute() reads it)
  bool fuse_q_kv_a_ = false;  // one product for the query projection and kv_a (see load())
  Workspace ws_;
  // An MTP module (see the class comment): its input norms and projection [D, 2D], and the
  // hidden rows of the next forward (set_hidden_input).
  bool mtp_ = false;
  Tensor enorm_, hnorm_, eh_proj_;
  Tensor hidden_in_;
};

// An MtpModule over a DeepseekModel made as one.
class DeepseekMtp final : public MtpModule {
 public:
  DeepseekMtp(const ModelConfig& cfg, Backend& backend, const DeepseekModel& target)
      : module_(cfg, backend, &target) {}
  Model& model() override { return module_; }
  void set_hidden_input(const Tensor& rows) override { module_.set_hidden_input(rows); }
  DeepseekModel& module() { return module_; }

 private:
  DeepseekModel module_;
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

Result<std::unique_ptr<MtpModule>> load_deepseek_mtp(const LoadedCheckpoint& ckpt, Backend& backend,
                                                     Model& target, const LoadOptions& opt) {
  const auto* t = dynamic_cast<const DeepseekModel*>(&target);
  if (t == nullptr || t->config().source != ckpt.config.source)
    return invalid_argument(ckpt.config.source +
                            ": an MTP module loads beside its own checkpoint's DeepSeek model");
  auto m = std::make_unique<DeepseekMtp>(ckpt.config, backend, *t);
  PAGELLM_RETURN_IF_ERROR(m->module().load(*ckpt.weights, opt));
  return std::unique_ptr<MtpModule>(std::move(m));
}

void register_deepseek_v2() {
  for (const char* name : {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
    register_architecture(name, make_deepseek);
}

}  // namespace pagellm
