// config.json -> ModelConfig. The shape fields are common to every architecture; each supported
// architecture then reads its own fields (biases, q/k norm, sliding window) through the table in
// arch_spec(). Anything that would change the math and is not implemented is refused by name.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/log.h"
#include "io/file_util.h"
#include "io/json_fields.h"
#include "io/model_config.h"

namespace pagellm {
namespace {

using json = nlohmann::json;

// Generous bounds that still keep products like vocab * hidden * layers far from int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;  // vocab, hidden, intermediate, head sizes
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

using io_detail::Fields;
using io_detail::fmt_double;
using io_detail::quote_name;

// --- token ids (config.json and generation_config.json) ---

Status read_token_id(const Fields& f, const std::string& key, std::optional<int32_t>& out) {
  const json* v = f.get(key);
  if (!v) return Status::ok_status();
  const json* scalar = v;
  if (v->is_array()) {
    // A list here (seen for pad_token_id) has one meaningful id; the first is the one used.
    if (v->empty()) return Status::ok_status();
    scalar = &(*v)[0];
  }
  std::optional<int64_t> id = Fields::to_int(*scalar);
  if (!id) return f.wrong_type(key, "a token id", *scalar);
  if (*id < 0 || *id > std::numeric_limits<int32_t>::max()) {
    return f.error(StatusCode::kInvalidArgument, key,
                   "= " + std::to_string(*id) + " is not a valid token id");
  }
  out = static_cast<int32_t>(*id);
  return Status::ok_status();
}

// eos_token_id: an int or a list of ints (Llama 3.1 lists several end tokens). Unset leaves `out`.
Status read_eos_ids(const Fields& f, std::vector<int32_t>& out) {
  const json* v = f.get("eos_token_id");
  if (!v) return Status::ok_status();
  std::vector<int32_t> ids;
  auto add = [&](const json& e) -> Status {
    std::optional<int64_t> id = Fields::to_int(e);
    if (!id) return f.wrong_type("eos_token_id", "an integer or a list of integers", e);
    if (*id < 0 || *id > std::numeric_limits<int32_t>::max()) {
      return f.error(StatusCode::kInvalidArgument, "eos_token_id",
                     "holds " + std::to_string(*id) + ", not a valid token id");
    }
    for (int32_t x : ids)
      if (x == *id) return Status::ok_status();  // keep each id once
    ids.push_back(static_cast<int32_t>(*id));
    return Status::ok_status();
  };
  if (v->is_array()) {
    for (const json& e : *v) PAGELLM_RETURN_IF_ERROR(add(e));
  } else {
    PAGELLM_RETURN_IF_ERROR(add(*v));
  }
  out = std::move(ids);
  return Status::ok_status();
}

// --- RoPE ---

// Keys a rope_scaling / rope_parameters dict may hold. Anything else (long_factor, short_factor,
// mrope_section, ...) belongs to a variant we do not implement and is refused by name.
constexpr const char* kRopeKeys[] = {
    "type",
    "rope_type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "partial_rotary_factor",
};

bool is_rope_key(const std::string& k) {
  for (const char* r : kRopeKeys)
    if (k == r) return true;
  return false;
}

Status parse_rope(const Fields& top, ModelConfig& cfg) {
  RopeConfig& rope = cfg.rope;
  PAGELLM_RETURN_IF_ERROR(top.read_double("rope_theta", rope.theta));
  std::optional<double> partial;
  PAGELLM_RETURN_IF_ERROR(top.read_opt_double("partial_rotary_factor", partial));

  // transformers gives rope_scaling (classic) priority over rope_parameters (transformers 5).
  std::string key = top.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* dict = top.get(key);
  std::string prefix = key + ".";
  if (dict && !dict->is_object()) return top.wrong_type(key, "an object", *dict);
  if (dict) {
    // transformers 5 may nest the parameters per layer type: {"full_attention": {...}}. Our
    // architectures have one layer type, so only that form (or the flat one) is accepted.
    bool nested = false;
    for (const auto& [k, v] : dict->items()) nested |= v.is_object();
    if (nested) {
      for (const auto& [k, v] : dict->items()) {
        if (k != "full_attention" && !v.is_null()) {
          return top.error(StatusCode::kUnimplemented, prefix + k,
                           "is not supported (per-layer-type RoPE; only 'full_attention' is)");
        }
      }
      const json* full = Fields(*dict, top.path(), prefix).get("full_attention");
      if (!full || !full->is_object()) {
        return top.error(StatusCode::kInvalidArgument, prefix + "full_attention",
                         "must be an object");
      }
      dict = full;
      prefix += "full_attention.";
    }
  }
  if (!dict) {
    rope.type = RopeType::kDefault;
  } else {
    const Fields f(*dict, top.path(), prefix);
    for (const auto& [k, v] : dict->items()) {
      if (!is_rope_key(k)) return f.error(StatusCode::kUnimplemented, k, "is not supported");
    }
    std::string type = "default";
    PAGELLM_RETURN_IF_ERROR(f.read_string("type", type));
    std::string type_key = "type";
    if (f.has("rope_type")) {
      PAGELLM_RETURN_IF_ERROR(
          f.read_string("rope_type", type));  // rope_type wins, as in transformers
      type_key = "rope_type";
    }
    PAGELLM_RETURN_IF_ERROR(f.read_double("rope_theta", rope.theta));
    PAGELLM_RETURN_IF_ERROR(f.read_opt_double("partial_rotary_factor", partial));

    std::optional<double> yarn_factor;
    if (type == "default") {
      rope.type = RopeType::kDefault;
    } else if (type == "linear") {
      rope.type = RopeType::kLinear;
      PAGELLM_RETURN_IF_ERROR(f.read_double("factor", rope.factor, /*required=*/true));
    } else if (type == "dynamic") {
      rope.type = RopeType::kDynamic;
      PAGELLM_RETURN_IF_ERROR(f.read_double("factor", rope.factor, /*required=*/true));
      PAGELLM_RETURN_IF_ERROR(
          f.read_int("original_max_position_embeddings", rope.original_max_position_embeddings));
    } else if (type == "llama3") {
      rope.type = RopeType::kLlama3;
      PAGELLM_RETURN_IF_ERROR(f.read_double("factor", rope.factor, true));
      PAGELLM_RETURN_IF_ERROR(f.read_double("low_freq_factor", rope.low_freq_factor, true));
      PAGELLM_RETURN_IF_ERROR(f.read_double("high_freq_factor", rope.high_freq_factor, true));
      PAGELLM_RETURN_IF_ERROR(f.check_positive("low_freq_factor", rope.low_freq_factor));
      if (!(rope.high_freq_factor > rope.low_freq_factor)) {
        // The smoothing ramp divides by (high - low).
        return f.error(StatusCode::kInvalidArgument, "high_freq_factor",
                       "= " + fmt_double(rope.high_freq_factor) +
                           " must exceed low_freq_factor = " + fmt_double(rope.low_freq_factor));
      }
    } else if (type == "yarn") {
      rope.type = RopeType::kYarn;
      PAGELLM_RETURN_IF_ERROR(f.read_opt_double("factor", yarn_factor));
      // beta_fast/beta_slow: transformers reads them with `or`, so 0 also means the default.
      PAGELLM_RETURN_IF_ERROR(f.read_double("beta_fast", rope.beta_fast));
      PAGELLM_RETURN_IF_ERROR(f.read_double("beta_slow", rope.beta_slow));
      if (rope.beta_fast == 0) rope.beta_fast = 32.0;
      if (rope.beta_slow == 0) rope.beta_slow = 1.0;
      PAGELLM_RETURN_IF_ERROR(f.check_positive("beta_fast", rope.beta_fast));
      PAGELLM_RETURN_IF_ERROR(f.check_positive("beta_slow", rope.beta_slow));
      PAGELLM_RETURN_IF_ERROR(f.read_opt_double("attention_factor", rope.attention_factor));
      PAGELLM_RETURN_IF_ERROR(f.read_opt_double("mscale", rope.mscale));
      PAGELLM_RETURN_IF_ERROR(f.read_opt_double("mscale_all_dim", rope.mscale_all_dim));
      PAGELLM_RETURN_IF_ERROR(f.read_bool("truncate", rope.truncate));
      if (rope.attention_factor)
        PAGELLM_RETURN_IF_ERROR(f.check_positive("attention_factor", *rope.attention_factor));
    } else {
      return f.error(StatusCode::kUnimplemented, type_key,
                     "= " + quote_name(type) +
                         " is not supported (supported: default, linear, dynamic, llama3, yarn)");
    }
    if (rope.type == RopeType::kLlama3 || rope.type == RopeType::kYarn) {
      // transformers takes a top-level original_max_position_embeddings first, then the dict's,
      // then max_position_embeddings.
      int64_t orig = cfg.max_position_embeddings;
      PAGELLM_RETURN_IF_ERROR(f.read_int("original_max_position_embeddings", orig));
      PAGELLM_RETURN_IF_ERROR(top.read_int("original_max_position_embeddings", orig));
      PAGELLM_RETURN_IF_ERROR(
          f.check_positive("original_max_position_embeddings", orig, kMaxPositions));
      rope.original_max_position_embeddings = orig;
      if (rope.type == RopeType::kYarn) {
        // Without a factor (DeepSeek-V3 style) the context extension ratio stands in for it.
        rope.factor = yarn_factor.value_or(static_cast<double>(cfg.max_position_embeddings) /
                                           static_cast<double>(orig));
      }
    } else if (rope.type == RopeType::kDynamic && rope.original_max_position_embeddings != 0) {
      PAGELLM_RETURN_IF_ERROR(f.check_positive("original_max_position_embeddings",
                                               rope.original_max_position_embeddings,
                                               kMaxPositions));
    }
    if (rope.type != RopeType::kDefault)
      PAGELLM_RETURN_IF_ERROR(f.check_positive("factor", rope.factor));
  }
  PAGELLM_RETURN_IF_ERROR(top.check_positive("rope_theta", rope.theta));
  if (partial) {
    if (!(*partial > 0 && *partial <= 1)) {
      return top.error(StatusCode::kInvalidArgument, "partial_rotary_factor",
                       "= " + fmt_double(*partial) + " must be in (0, 1]");
    }
    rope.partial_rotary_factor = *partial;
  }
  return Status::ok_status();
}

// --- the common shape fields ---

// Per-architecture defaults and fields. To add an architecture (DeepseekV2/V3: MLA ranks, MoE
// routing; Mixtral: experts), add a row to arch_spec() with its defaults and a parse_<arch>
// function for its own fields; ModelConfig grows the matching members.
struct ArchSpec {
  const char* architecture;
  const char* model_type;
  int64_t default_max_position;             // transformers' config class default
  std::optional<int64_t> default_head_dim;  // when absent: this, else hidden / heads
  Status (*parse)(const Fields& f, ModelConfig& cfg);
};

Status parse_common(const Fields& f, const ArchSpec* spec, ModelConfig& cfg) {
  PAGELLM_RETURN_IF_ERROR(f.read_int("vocab_size", cfg.vocab_size, true));
  PAGELLM_RETURN_IF_ERROR(f.read_int("hidden_size", cfg.hidden_size, true));
  PAGELLM_RETURN_IF_ERROR(f.read_int("intermediate_size", cfg.intermediate_size, true));
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_hidden_layers", cfg.num_hidden_layers, true));
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_attention_heads", cfg.num_attention_heads, true));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("vocab_size", cfg.vocab_size, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("hidden_size", cfg.hidden_size, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("intermediate_size", cfg.intermediate_size, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("num_hidden_layers", cfg.num_hidden_layers, kMaxLayers));
  PAGELLM_RETURN_IF_ERROR(
      f.check_positive("num_attention_heads", cfg.num_attention_heads, kMaxDim));

  cfg.num_key_value_heads = cfg.num_attention_heads;
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_key_value_heads", cfg.num_key_value_heads));
  PAGELLM_RETURN_IF_ERROR(
      f.check_positive("num_key_value_heads", cfg.num_key_value_heads, kMaxDim));
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0) {
    return f.error(
        StatusCode::kInvalidArgument, "num_key_value_heads",
        "= " + std::to_string(cfg.num_key_value_heads) +
            " does not divide num_attention_heads = " + std::to_string(cfg.num_attention_heads));
  }

  if (f.has("head_dim")) {
    PAGELLM_RETURN_IF_ERROR(f.read_int("head_dim", cfg.head_dim));
  } else if (spec && spec->default_head_dim) {
    cfg.head_dim = *spec->default_head_dim;
  } else {
    if (cfg.hidden_size % cfg.num_attention_heads != 0) {
      return f.error(StatusCode::kInvalidArgument, "hidden_size",
                     "= " + std::to_string(cfg.hidden_size) +
                         " is not divisible by num_attention_heads = " +
                         std::to_string(cfg.num_attention_heads) + " (and no head_dim is given)");
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  }
  PAGELLM_RETURN_IF_ERROR(f.check_positive("head_dim", cfg.head_dim, kMaxDim));

  cfg.max_position_embeddings = spec ? spec->default_max_position : 2048;
  PAGELLM_RETURN_IF_ERROR(f.read_int("max_position_embeddings", cfg.max_position_embeddings));
  PAGELLM_RETURN_IF_ERROR(
      f.check_positive("max_position_embeddings", cfg.max_position_embeddings, kMaxPositions));

  cfg.rms_norm_eps = 1e-6;
  PAGELLM_RETURN_IF_ERROR(f.read_double("rms_norm_eps", cfg.rms_norm_eps));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("rms_norm_eps", cfg.rms_norm_eps));

  PAGELLM_RETURN_IF_ERROR(f.read_string("hidden_act", cfg.hidden_act));
  if (cfg.hidden_act != "silu") {
    return f.error(StatusCode::kUnimplemented, "hidden_act",
                   "= " + quote_name(cfg.hidden_act) + " is not supported (only 'silu')");
  }
  PAGELLM_RETURN_IF_ERROR(f.read_bool("tie_word_embeddings", cfg.tie_word_embeddings));

  // Fields that change the math in ways we do not implement.
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (f.has(key)) return f.error(StatusCode::kUnimplemented, key, "is not supported");
  }
  // 4-bit packed weights (io/packed_int4.h unpacks them); other schemes are refused by name.
  if (const json* q = f.get("quantization_config")) {
    if (!q->is_object()) return f.wrong_type("quantization_config", "an object", *q);
    PAGELLM_ASSIGN_OR_RETURN(QuantConfig qc,
                             parse_quant_config(Fields(*q, f.path(), "quantization_config.")));
    cfg.quantization = std::move(qc);
  }

  PAGELLM_RETURN_IF_ERROR(parse_rope(f, cfg));
  const int64_t rotary = cfg.rotary_dim();
  if (rotary < 2 || rotary % 2 != 0) {
    return f.error(StatusCode::kInvalidArgument, "partial_rotary_factor",
                   "gives a rotary dimension of " + std::to_string(rotary) + " (head_dim " +
                       std::to_string(cfg.head_dim) + "); it must be even and at least 2");
  }

  PAGELLM_RETURN_IF_ERROR(read_eos_ids(f, cfg.eos_token_ids));
  PAGELLM_RETURN_IF_ERROR(read_token_id(f, "bos_token_id", cfg.bos_token_id));
  PAGELLM_RETURN_IF_ERROR(read_token_id(f, "pad_token_id", cfg.pad_token_id));
  return Status::ok_status();
}

// --- architecture-specific fields ---

Status parse_llama(const Fields& f, ModelConfig& cfg) {
  // Llama's attention_bias puts a bias on all four projections, o_proj included.
  PAGELLM_RETURN_IF_ERROR(f.read_bool("attention_bias", cfg.attention_bias));
  cfg.o_proj_bias = cfg.attention_bias;
  return f.read_bool("mlp_bias", cfg.mlp_bias);
}

Status parse_mistral(const Fields& f, ModelConfig& cfg) {
  // Mistral's projections never have biases. sliding_window: absent means transformers' default
  // 4096; null means full attention (Mistral v0.2 and later publish null).
  auto it = f.object().find("sliding_window");
  if (it == f.object().end()) {
    cfg.sliding_window = 4096;
  } else if (!it->is_null()) {
    int64_t w = 0;
    PAGELLM_RETURN_IF_ERROR(f.read_int("sliding_window", w));
    PAGELLM_RETURN_IF_ERROR(f.check_positive("sliding_window", w, kMaxPositions));
    cfg.sliding_window = w;
  }
  return Status::ok_status();
}

// Qwen2 and Qwen3 share the sliding-window rule: a window only on layers >= max_window_layers,
// and only with use_sliding_window. That per-layer rule is not implemented, so it is refused.
Status check_qwen_window(const Fields& f) {
  bool use_sliding_window = false;
  PAGELLM_RETURN_IF_ERROR(f.read_bool("use_sliding_window", use_sliding_window));
  if (use_sliding_window) {
    return f.error(StatusCode::kUnimplemented, "use_sliding_window",
                   "= true is not supported (per-layer windows from max_window_layers)");
  }
  if (const json* lt = f.get("layer_types")) {
    if (!lt->is_array()) return f.wrong_type("layer_types", "an array", *lt);
    for (const json& t : *lt) {
      if (!t.is_string() || t.get_ref<const std::string&>() != "full_attention") {
        return f.error(
            StatusCode::kUnimplemented, "layer_types",
            "holds a layer type other than 'full_attention'; only full attention is supported");
      }
    }
  }
  return Status::ok_status();
}

Status parse_qwen2(const Fields& f, ModelConfig& cfg) {
  // Qwen2: bias on q, k, v always; none on o_proj or the MLP (attention_bias is not read).
  cfg.attention_bias = true;
  cfg.o_proj_bias = false;
  return check_qwen_window(f);
}

Status parse_qwen3(const Fields& f, ModelConfig& cfg) {
  // Qwen3: RMSNorm on each q and k head; attention_bias (default false) covers all four
  // projections.
  cfg.qk_norm = true;
  PAGELLM_RETURN_IF_ERROR(f.read_bool("attention_bias", cfg.attention_bias));
  cfg.o_proj_bias = cfg.attention_bias;
  return check_qwen_window(f);
}

// --- DeepSeek-V2/V3 (MLA + DeepSeekMoE) and Mixtral ---

// A field only one value of which is supported.
Status require_value(const Fields& f, const std::string& key, bool ok, const std::string& what) {
  if (ok) return Status::ok_status();
  return f.error(StatusCode::kUnimplemented, key, "is not supported " + what);
}

// Routing fields shared by the MoE architectures, checked for consistency.
Status check_moe(const Fields& f, const ModelConfig& cfg) {
  PAGELLM_RETURN_IF_ERROR(f.check_positive("num_experts_per_tok", cfg.num_experts_per_tok,
                                           cfg.n_routed_experts));
  if (cfg.topk_method != MoeTopk::kGreedy) {
    PAGELLM_RETURN_IF_ERROR(f.check_positive("n_group", cfg.n_group, cfg.n_routed_experts));
    if (cfg.n_routed_experts % cfg.n_group != 0) {
      return f.error(StatusCode::kInvalidArgument, "n_group",
                     "= " + std::to_string(cfg.n_group) + " does not divide n_routed_experts = " +
                         std::to_string(cfg.n_routed_experts));
    }
    PAGELLM_RETURN_IF_ERROR(f.check_positive("topk_group", cfg.topk_group, cfg.n_group));
    const int64_t per_group = cfg.n_routed_experts / cfg.n_group;
    if (cfg.num_experts_per_tok > cfg.topk_group * per_group) {
      return f.error(StatusCode::kInvalidArgument, "num_experts_per_tok",
                     "= " + std::to_string(cfg.num_experts_per_tok) +
                         " exceeds the experts of topk_group groups (" +
                         std::to_string(cfg.topk_group * per_group) + ")");
    }
    if (cfg.topk_method == MoeTopk::kNoauxTc && per_group < 2) {
      return f.error(StatusCode::kInvalidArgument, "n_group",
                     "leaves fewer than 2 experts per group (noaux_tc ranks groups by their top 2)");
    }
  }
  return Status::ok_status();
}

Status parse_deepseek(const Fields& f, ModelConfig& cfg, bool v3) {
  // q_lora_rank: absent means the config class default (1536); null means a plain q_proj.
  auto q_it = f.object().find("q_lora_rank");
  if (q_it == f.object().end()) {
    cfg.q_lora_rank = 1536;
  } else if (!q_it->is_null()) {
    int64_t r = 0;
    PAGELLM_RETURN_IF_ERROR(f.read_int("q_lora_rank", r));
    PAGELLM_RETURN_IF_ERROR(f.check_positive("q_lora_rank", r, kMaxDim));
    cfg.q_lora_rank = r;
  }
  cfg.kv_lora_rank = 512;
  cfg.qk_nope_head_dim = 128;
  cfg.qk_rope_head_dim = 64;
  cfg.v_head_dim = 128;
  PAGELLM_RETURN_IF_ERROR(f.read_int("kv_lora_rank", cfg.kv_lora_rank));
  PAGELLM_RETURN_IF_ERROR(f.read_int("qk_nope_head_dim", cfg.qk_nope_head_dim));
  PAGELLM_RETURN_IF_ERROR(f.read_int("qk_rope_head_dim", cfg.qk_rope_head_dim));
  PAGELLM_RETURN_IF_ERROR(f.read_int("v_head_dim", cfg.v_head_dim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("kv_lora_rank", cfg.kv_lora_rank, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("qk_nope_head_dim", cfg.qk_nope_head_dim, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("qk_rope_head_dim", cfg.qk_rope_head_dim, kMaxDim));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("v_head_dim", cfg.v_head_dim, kMaxDim));
  if (cfg.qk_rope_head_dim % 2 != 0) {
    return f.error(StatusCode::kInvalidArgument, "qk_rope_head_dim",
                   "= " + std::to_string(cfg.qk_rope_head_dim) + " must be even");
  }
  if (cfg.rope.partial_rotary_factor != 1.0) {
    return f.error(StatusCode::kUnimplemented, "partial_rotary_factor",
                   "is not supported for " + cfg.architecture +
                       " (the rotary part is qk_rope_head_dim)");
  }
  // As in transformers, RoPE tables are built for head_dim = qk_rope_head_dim.
  cfg.head_dim = cfg.qk_rope_head_dim;

  PAGELLM_RETURN_IF_ERROR(f.read_bool("attention_bias", cfg.attention_bias));
  cfg.o_proj_bias = cfg.attention_bias;
  bool mlp_bias = false;
  PAGELLM_RETURN_IF_ERROR(f.read_bool("mlp_bias", mlp_bias));
  PAGELLM_RETURN_IF_ERROR(require_value(f, "mlp_bias", !mlp_bias, "(only false)"));
  // DeepSeek-V2 rotates interleaved pairs always; V3 by rope_interleave (default true).
  cfg.rope.interleaved = true;
  if (v3) PAGELLM_RETURN_IF_ERROR(f.read_bool("rope_interleave", cfg.rope.interleaved));

  cfg.n_routed_experts = v3 ? 256 : 64;
  cfg.n_shared_experts = v3 ? 1 : 2;
  cfg.num_experts_per_tok = v3 ? 8 : 0;
  cfg.moe_intermediate_size = v3 ? 2048 : 1407;
  cfg.first_k_dense_replace = v3 ? 3 : 0;
  cfg.routed_scaling_factor = v3 ? 2.5 : 1.0;
  cfg.n_group = v3 ? 8 : 1;
  cfg.topk_group = v3 ? 4 : 1;
  cfg.norm_topk_prob = v3;
  PAGELLM_RETURN_IF_ERROR(f.read_int("n_routed_experts", cfg.n_routed_experts));
  PAGELLM_RETURN_IF_ERROR(f.read_int("n_shared_experts", cfg.n_shared_experts));
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_experts_per_tok", cfg.num_experts_per_tok));
  PAGELLM_RETURN_IF_ERROR(f.read_int("moe_intermediate_size", cfg.moe_intermediate_size));
  PAGELLM_RETURN_IF_ERROR(f.read_int("first_k_dense_replace", cfg.first_k_dense_replace));
  PAGELLM_RETURN_IF_ERROR(f.read_int("moe_layer_freq", cfg.moe_layer_freq));
  PAGELLM_RETURN_IF_ERROR(f.read_double("routed_scaling_factor", cfg.routed_scaling_factor));
  PAGELLM_RETURN_IF_ERROR(f.read_int("n_group", cfg.n_group));
  PAGELLM_RETURN_IF_ERROR(f.read_int("topk_group", cfg.topk_group));
  PAGELLM_RETURN_IF_ERROR(f.read_bool("norm_topk_prob", cfg.norm_topk_prob));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("n_routed_experts", cfg.n_routed_experts, kMaxDim));
  if (cfg.n_shared_experts < 0 || cfg.n_shared_experts > kMaxDim) {
    return f.error(StatusCode::kInvalidArgument, "n_shared_experts",
                   "= " + std::to_string(cfg.n_shared_experts) + " is out of range");
  }
  PAGELLM_RETURN_IF_ERROR(
      f.check_positive("moe_intermediate_size", cfg.moe_intermediate_size, kMaxDim));
  if (cfg.first_k_dense_replace < 0) {
    return f.error(StatusCode::kInvalidArgument, "first_k_dense_replace", "must not be negative");
  }
  // transformers makes every layer from first_k_dense_replace on an MoE layer, whatever
  // moe_layer_freq says; only the value where that agrees with DeepSeek's definition is accepted.
  PAGELLM_RETURN_IF_ERROR(require_value(f, "moe_layer_freq", cfg.moe_layer_freq == 1,
                                        "(only 1: every layer from first_k_dense_replace on)"));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("routed_scaling_factor", cfg.routed_scaling_factor));

  std::string topk = v3 ? "noaux_tc" : "greedy";
  std::string scoring = v3 ? "sigmoid" : "softmax";
  PAGELLM_RETURN_IF_ERROR(f.read_string("topk_method", topk));
  PAGELLM_RETURN_IF_ERROR(f.read_string("scoring_func", scoring));
  if (v3) {
    // transformers' DeepSeek-V3 router is noaux_tc over sigmoid scores, nothing else.
    PAGELLM_RETURN_IF_ERROR(require_value(f, "topk_method", topk == "noaux_tc",
                                          "= " + quote_name(topk) + " for " + cfg.architecture +
                                              " (only 'noaux_tc')"));
    PAGELLM_RETURN_IF_ERROR(require_value(f, "scoring_func", scoring == "sigmoid",
                                          "= " + quote_name(scoring) + " for " +
                                              cfg.architecture + " (only 'sigmoid')"));
    cfg.topk_method = MoeTopk::kNoauxTc;
    cfg.scoring_func = MoeScoring::kSigmoid;
    PAGELLM_RETURN_IF_ERROR(f.read_int("num_nextn_predict_layers", cfg.num_nextn_predict_layers));
  } else {
    if (topk == "greedy") {
      cfg.topk_method = MoeTopk::kGreedy;
    } else if (topk == "group_limited_greedy") {
      cfg.topk_method = MoeTopk::kGroupLimitedGreedy;
    } else {
      return f.error(StatusCode::kUnimplemented, "topk_method",
                     "= " + quote_name(topk) + " is not supported for " + cfg.architecture +
                         " (supported: greedy, group_limited_greedy)");
    }
    // transformers' DeepSeek-V2 router is softmax and never renormalizes the chosen weights.
    PAGELLM_RETURN_IF_ERROR(require_value(f, "scoring_func", scoring == "softmax",
                                          "= " + quote_name(scoring) + " for " +
                                              cfg.architecture + " (only 'softmax')"));
    PAGELLM_RETURN_IF_ERROR(require_value(f, "norm_topk_prob", !cfg.norm_topk_prob,
                                          "= true for " + cfg.architecture + " (only false)"));
    cfg.scoring_func = MoeScoring::kSoftmax;
  }
  return check_moe(f, cfg);
}

Status parse_deepseek_v2(const Fields& f, ModelConfig& cfg) { return parse_deepseek(f, cfg, false); }
Status parse_deepseek_v3(const Fields& f, ModelConfig& cfg) { return parse_deepseek(f, cfg, true); }

Status parse_mixtral(const Fields& f, ModelConfig& cfg) {
  // Mixtral's sliding_window defaults to null (full attention).
  if (f.has("sliding_window")) {
    int64_t w = 0;
    PAGELLM_RETURN_IF_ERROR(f.read_int("sliding_window", w));
    PAGELLM_RETURN_IF_ERROR(f.check_positive("sliding_window", w, kMaxPositions));
    cfg.sliding_window = w;
  }
  // The router: softmax over the experts, top-k, weights renormalized to sum to 1.
  cfg.n_routed_experts = 8;
  cfg.num_experts_per_tok = 2;
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_local_experts", cfg.n_routed_experts));
  PAGELLM_RETURN_IF_ERROR(f.read_int("num_experts_per_tok", cfg.num_experts_per_tok));
  PAGELLM_RETURN_IF_ERROR(f.check_positive("num_local_experts", cfg.n_routed_experts, kMaxDim));
  cfg.moe_intermediate_size = cfg.intermediate_size;
  cfg.topk_method = MoeTopk::kGreedy;
  cfg.scoring_func = MoeScoring::kSoftmax;
  cfg.norm_topk_prob = true;
  return check_moe(f, cfg);
}

const ArchSpec* arch_spec(const std::string& architecture) {
  static const ArchSpec kSpecs[] = {
      {"LlamaForCausalLM", "llama", 2048, std::nullopt, parse_llama},
      {"MistralForCausalLM", "mistral", 4096 * 32, std::nullopt, parse_mistral},
      {"Qwen2ForCausalLM", "qwen2", 32768, std::nullopt, parse_qwen2},
      // transformers' Qwen3Config defaults head_dim to 128 rather than deriving it.
      {"Qwen3ForCausalLM", "qwen3", 32768, int64_t{128}, parse_qwen3},
      {"DeepseekV2ForCausalLM", "deepseek_v2", 2048, std::nullopt, parse_deepseek_v2},
      {"DeepseekV3ForCausalLM", "deepseek_v3", 4096, std::nullopt, parse_deepseek_v3},
      {"MixtralForCausalLM", "mixtral", 4096 * 32, std::nullopt, parse_mixtral},
  };
  for (const ArchSpec& s : kSpecs)
    if (architecture == s.architecture) return &s;
  return nullptr;
}

// Configs without "architectures" name their family by model_type only.
const char* architecture_for_model_type(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "deepseek_v2") return "DeepseekV2ForCausalLM";
  if (model_type == "deepseek_v3") return "DeepseekV3ForCausalLM";
  if (model_type == "mixtral") return "MixtralForCausalLM";
  return nullptr;
}

}  // namespace

Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& path) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(path + ": not valid JSON");
  if (!root.is_object()) return invalid_argument(path + ": not a JSON object");
  const Fields f(root, path);

  ModelConfig cfg;
  cfg.source = path;
  PAGELLM_RETURN_IF_ERROR(f.read_string("model_type", cfg.model_type));
  if (const json* archs = f.get("architectures")) {
    if (!archs->is_array()) return f.wrong_type("architectures", "a list of strings", *archs);
    if (archs->empty()) return f.error(StatusCode::kInvalidArgument, "architectures", "is empty");
    if (!(*archs)[0].is_string())
      return f.wrong_type("architectures", "a list of strings", (*archs)[0]);
    cfg.architecture = (*archs)[0].get<std::string>();
  } else if (const char* a = architecture_for_model_type(cfg.model_type)) {
    cfg.architecture = a;
  } else {
    return f.missing("architectures");
  }

  const ArchSpec* spec = arch_spec(cfg.architecture);
  if (!spec) {
    // Not an architecture we run: keep its name (the model registry refuses it with a clear
    // message) and whatever common fields parse, so `inspect` can still describe it.
    ModelConfig generic = cfg;
    const Status st = parse_common(f, nullptr, generic);
    if (st.ok()) return generic;
    PAGELLM_LOG_DEBUG("%s: %s: %s", path.c_str(), cfg.architecture.c_str(), st.message().c_str());
    (void)read_eos_ids(f, cfg.eos_token_ids);
    (void)read_token_id(f, "bos_token_id", cfg.bos_token_id);
    (void)read_token_id(f, "pad_token_id", cfg.pad_token_id);
    return cfg;
  }
  if (cfg.model_type.empty()) cfg.model_type = spec->model_type;
  PAGELLM_RETURN_IF_ERROR(parse_common(f, spec, cfg));
  PAGELLM_RETURN_IF_ERROR(spec->parse(f, cfg));
  return cfg;
}

Status apply_generation_config(const std::string& json_text, const std::string& path,
                               ModelConfig& cfg) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(path + ": not valid JSON");
  if (!root.is_object()) return invalid_argument(path + ": not a JSON object");
  const Fields f(root, path);
  // Parse into copies so a bad field leaves cfg untouched.
  std::vector<int32_t> eos = cfg.eos_token_ids;
  std::optional<int32_t> bos = cfg.bos_token_id;
  std::optional<int32_t> pad = cfg.pad_token_id;
  PAGELLM_RETURN_IF_ERROR(read_eos_ids(f, eos));
  PAGELLM_RETURN_IF_ERROR(read_token_id(f, "bos_token_id", bos));
  PAGELLM_RETURN_IF_ERROR(read_token_id(f, "pad_token_id", pad));
  cfg.eos_token_ids = std::move(eos);
  cfg.bos_token_id = bos;
  cfg.pad_token_id = pad;
  return Status::ok_status();
}

Result<ModelConfig> load_hf_config(const std::string& model_dir) {
  const std::string path = io_detail::join_path(model_dir, "config.json");
  Result<std::string> text = io_detail::read_text_file(path);
  if (!text.ok()) return text.status();
  PAGELLM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_hf_config(*text, path));

  const std::string gen_path = io_detail::join_path(model_dir, "generation_config.json");
  std::error_code ec;
  if (std::filesystem::exists(gen_path, ec)) {
    PAGELLM_ASSIGN_OR_RETURN(std::string gen, io_detail::read_text_file(gen_path));
    PAGELLM_RETURN_IF_ERROR(apply_generation_config(gen, gen_path, cfg));
  }
  return cfg;
}

namespace {

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

const char* yes_no(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

std::string describe(const ModelConfig& cfg) {
  std::string s;
  auto line = [&](const char* key, const std::string& value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%-24s", key);
    s += buf;
    s += value;
    s += '\n';
  };
  line("architecture",
       cfg.architecture + (cfg.model_type.empty() ? "" : " (" + cfg.model_type + ")"));
  if (!cfg.source.empty()) line("source", cfg.source);
  if (cfg.hidden_size == 0) {
    line("shape", "unknown (architecture not supported)");
    return s;
  }
  line("vocab_size", std::to_string(cfg.vocab_size));
  line("hidden_size", std::to_string(cfg.hidden_size));
  line("intermediate_size", std::to_string(cfg.intermediate_size));
  line("num_hidden_layers", std::to_string(cfg.num_hidden_layers));
  line("attention", std::to_string(cfg.num_attention_heads) + " heads, " +
                        std::to_string(cfg.num_key_value_heads) + " kv heads, head_dim " +
                        std::to_string(cfg.head_dim) + " (q_dim " + std::to_string(cfg.q_dim()) +
                        ", kv_dim " + std::to_string(cfg.kv_dim()) + ")");
  line("max_position_embeddings", std::to_string(cfg.max_position_embeddings));
  line("rms_norm_eps", fmt_double(cfg.rms_norm_eps));
  line("hidden_act", cfg.hidden_act);
  line("biases", std::string("qkv ") + yes_no(cfg.attention_bias) + ", o_proj " +
                     yes_no(cfg.o_proj_bias) + ", mlp " + yes_no(cfg.mlp_bias));
  line("qk_norm", yes_no(cfg.qk_norm));
  line("sliding_window", cfg.sliding_window ? std::to_string(*cfg.sliding_window) : "none");
  line("tie_word_embeddings", yes_no(cfg.tie_word_embeddings));
  if (cfg.quantization) {
    const QuantConfig& q = *cfg.quantization;
    if (q.method == QuantMethod::kFp8) {
      line("quantization",
           std::string("fp8 e4m3, scales ") +
               (q.fp8_block.empty() ? std::string("per tensor or channel")
                                    : "per " + std::to_string(q.fp8_block[0]) + " x " +
                                          std::to_string(q.fp8_block[1]) + " block") +
               (q.fp8_static_activations ? ", static activation scales" : ""));
    } else {
      line("quantization",
           std::string(quant_method_name(q.method)) + ", " + std::to_string(q.bits) +
               "-bit, group " +
               (q.group_size < 0 ? std::string("per row") : std::to_string(q.group_size)) +
               (q.zero_point ? ", zero points" : ", symmetric") + (q.desc_act ? ", desc_act" : ""));
    }
  }

  if (cfg.kv_lora_rank > 0) {
    line("mla", "q_lora_rank " + (cfg.q_lora_rank ? std::to_string(*cfg.q_lora_rank) : "none") +
                    ", kv_lora_rank " + std::to_string(cfg.kv_lora_rank) + ", qk_nope " +
                    std::to_string(cfg.qk_nope_head_dim) + ", qk_rope " +
                    std::to_string(cfg.qk_rope_head_dim) + ", v " + std::to_string(cfg.v_head_dim));
  }
  if (cfg.n_routed_experts > 0) {
    const char* topk = cfg.topk_method == MoeTopk::kGreedy             ? "greedy"
                       : cfg.topk_method == MoeTopk::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                         : "noaux_tc";
    line("moe", std::to_string(cfg.n_routed_experts) + " routed experts (top " +
                    std::to_string(cfg.num_experts_per_tok) + ", " + topk + ", " +
                    (cfg.scoring_func == MoeScoring::kSoftmax ? "softmax" : "sigmoid") +
                    (cfg.norm_topk_prob ? ", renormalized" : "") + ", scale " +
                    fmt_double(cfg.routed_scaling_factor) + "), " +
                    std::to_string(cfg.n_shared_experts) + " shared, intermediate " +
                    std::to_string(cfg.moe_intermediate_size) + ", dense layers " +
                    std::to_string(cfg.first_k_dense_replace));
  }

  const RopeConfig& r = cfg.rope;
  std::string rope = std::string(rope_type_name(r.type)) + ", theta " + fmt_double(r.theta);
  if (r.type != RopeType::kDefault) rope += ", factor " + fmt_double(r.factor);
  if (r.type == RopeType::kLlama3) {
    rope += ", low_freq_factor " + fmt_double(r.low_freq_factor) + ", high_freq_factor " +
            fmt_double(r.high_freq_factor);
  }
  if (r.type == RopeType::kYarn) {
    rope += ", beta_fast " + fmt_double(r.beta_fast) + ", beta_slow " + fmt_double(r.beta_slow);
    if (r.attention_factor) rope += ", attention_factor " + fmt_double(*r.attention_factor);
    if (r.mscale) rope += ", mscale " + fmt_double(*r.mscale);
    if (r.mscale_all_dim) rope += ", mscale_all_dim " + fmt_double(*r.mscale_all_dim);
    if (!r.truncate) rope += ", truncate false";
  }
  if (r.original_max_position_embeddings) {
    rope +=
        ", original_max_position_embeddings " + std::to_string(r.original_max_position_embeddings);
  }
  if (r.interleaved) rope += ", interleaved";
  line("rope", rope);
  line("rotary_dim", std::to_string(cfg.rotary_dim()) + " (partial_rotary_factor " +
                         fmt_double(r.partial_rotary_factor) + ")");

  std::string eos;
  for (size_t i = 0; i < cfg.eos_token_ids.size(); ++i)
    eos += (i ? ", " : "") + std::to_string(cfg.eos_token_ids[i]);
  line("eos_token_ids", eos.empty() ? "none" : eos);
  line("bos_token_id", cfg.bos_token_id ? std::to_string(*cfg.bos_token_id) : "none");
  line("pad_token_id", cfg.pad_token_id ? std::to_string(*cfg.pad_token_id) : "none");
  return s;
}

}  // namespace pagellm
