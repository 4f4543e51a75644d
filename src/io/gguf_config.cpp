// ModelConfig from GGUF metadata, and open_gguf_checkpoint.
//
// llama.cpp's converter writes the hyper-parameters under "<arch>.<name>" keys. Mistral files use
// arch "llama". Each key that changes the math is either mapped to a ModelConfig field or refused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "io/gguf.h"

namespace pagellm {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 20;        // hidden/intermediate/head sizes
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

struct ArchInfo {
  const char* gguf_arch;
  const char* hf_arch;
  const char* model_type;
};
constexpr ArchInfo kArchs[] = {
    {"llama", "LlamaForCausalLM", "llama"},
    {"qwen2", "Qwen2ForCausalLM", "qwen2"},
    {"qwen3", "Qwen3ForCausalLM", "qwen3"},
};

// Reads "<arch>.<name>" style keys with defaults and range checks; messages name file and key.
class Meta {
 public:
  Meta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string key(const std::string& name) const { return arch_ + "." + name; }

  Status int_required(const std::string& k, int64_t lo, int64_t hi, int64_t& out) const {
    if (!f_.has(k)) return not_found(f_.path() + ": required metadata key '" + k + "' is missing");
    return int_optional(k, lo, hi, out);
  }
  Status int_optional(const std::string& k, int64_t lo, int64_t hi, int64_t& out) const {
    if (!f_.has(k)) return Status::ok_status();
    PAGELLM_ASSIGN_OR_RETURN(int64_t v, f_.get_i64(k));
    if (v < lo || v > hi)
      return out_of_range(f_.path() + ": metadata key '" + k + "' = " + std::to_string(v) +
                          " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out = v;
    return Status::ok_status();
  }
  Status positive_double(const std::string& k, double& out) const {
    if (!f_.has(k)) return Status::ok_status();
    PAGELLM_ASSIGN_OR_RETURN(double v, f_.get_f64(k));
    if (!(v > 0) || !std::isfinite(v))
      return out_of_range(f_.path() + ": metadata key '" + k + "' = " + std::to_string(v) +
                          " must be positive and finite");
    out = v;
    return Status::ok_status();
  }
  Status refuse_if_present(const std::string& k, const std::string& why) const {
    if (f_.has(k)) return unimplemented(f_.path() + ": metadata key '" + k + "' is not supported (" + why + ")");
    return Status::ok_status();
  }

 private:
  const GgufFile& f_;
  std::string arch_;
};

// HF's llama3 frequency divisor for a wavelength (transformers' _compute_llama3_parameters):
// 1 above the high-frequency bound, `factor` below the low one, a smooth ramp in between.
double llama3_divisor(const RopeConfig& r, double wavelen) {
  const double old_ctx = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old_ctx / r.low_freq_factor;
  const double high_wavelen = old_ctx / r.high_freq_factor;
  if (wavelen < high_wavelen) return 1.0;
  if (wavelen > low_wavelen) return r.factor;
  const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return 1.0 / ((1.0 - smooth) / r.factor + smooth);
}

// llama.cpp's converter does not store llama3 rope scaling as keys: it bakes the per-frequency
// divisors into a tensor `rope_freqs.weight` [rotary_dim / 2]. Recover equivalent HF parameters.
// The ramp is linear in 1/wavelength, so two ramp points fix it; (low, high, original context)
// are determined only up to a common scale, which leaves the divisors unchanged. When the ramp
// holds fewer than two frequencies any line that separates the neighbours gives the same divisors.
// The result is checked by recomputing every divisor; anything else is refused.
Status fold_rope_freqs(const GgufFile& f, const GgufTensor& t, int64_t orig_ctx, ModelConfig& cfg) {
  const std::string where = f.path() + ": tensor 'rope_freqs.weight'";
  const int64_t n = cfg.rotary_dim() / 2;
  if (t.ggml_type != static_cast<uint32_t>(GgmlType::kF32) || t.dims.size() != 1 || t.dims[0] != n)
    return invalid_argument(where + " must be f32 [" + std::to_string(n) + "] (rotary_dim / 2)");
  if (cfg.rope.type != RopeType::kDefault)
    return unimplemented(where + " together with rope.scaling.type is not supported");
  std::vector<double> div(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, t.data + 4 * i, 4);
    if (!(v > 0) || !std::isfinite(v))
      return invalid_argument(where + ": element " + std::to_string(i) + " = " + std::to_string(v) +
                              " must be positive and finite");
    div[i] = v;
  }
  const double factor = *std::max_element(div.begin(), div.end());
  constexpr double kTol = 1e-5;  // the divisors are stored in f32
  auto near = [](double a, double b) { return std::abs(a - b) <= kTol * std::max(1.0, std::abs(b)); };
  if (std::all_of(div.begin(), div.end(), [&](double d) { return near(d, 1.0); })) return Status::ok_status();
  if (std::all_of(div.begin(), div.end(), [&](double d) { return near(d, factor); })) {
    cfg.rope.type = RopeType::kLinear;  // every frequency divided alike: linear position scaling
    cfg.rope.factor = factor;
    return Status::ok_status();
  }
  // x = 1 / wavelength, decreasing with i; smooth(x) = a x + b on the ramp.
  const double rot = static_cast<double>(cfg.rotary_dim());
  std::vector<double> x(static_cast<size_t>(n)), s(static_cast<size_t>(n));
  std::vector<int64_t> ramp;
  int64_t last_high = -1, first_low = n;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::pow(cfg.rope.theta, -2.0 * static_cast<double>(i) / rot) / (2 * std::numbers::pi);
    s[i] = (1.0 / div[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
    if (near(div[i], 1.0)) {
      last_high = i;
    } else if (near(div[i], factor)) {
      first_low = std::min(first_low, i);
    } else {
      ramp.push_back(i);
    }
  }
  std::vector<std::pair<double, double>> lines;  // candidate (a, b)
  auto through = [&](double x0, double s0, double x1, double s1) {
    if (x1 != x0) lines.emplace_back((s1 - s0) / (x1 - x0), s0 - (s1 - s0) / (x1 - x0) * x0);
  };
  // Neighbouring x values outside the ramp (or a stand-in an octave away when there is none).
  const int64_t lo_i = ramp.empty() ? first_low : ramp.front();
  const int64_t hi_i = ramp.empty() ? last_high : ramp.back();
  const double x_high = last_high >= 0 ? x[last_high] : 2 * x[std::max<int64_t>(lo_i, 0)];
  const double x_low = first_low < n ? x[first_low] : 0.5 * x[std::min<int64_t>(hi_i, n - 1)];
  if (ramp.size() >= 2) {
    through(x[ramp.front()], s[ramp.front()], x[ramp.back()], s[ramp.back()]);
  } else if (ramp.size() == 1) {
    const int64_t m = ramp[0];
    through((x_low + x[m]) / 2, 0.0, x[m], s[m]);
    through(x[m], s[m], (x[m] + x_high) / 2, 1.0);
  } else {
    through(x_low + (x_high - x_low) / 3, 0.0, x_low + 2 * (x_high - x_low) / 3, 1.0);
  }
  const double old_ctx = static_cast<double>(orig_ctx);
  for (const auto& [a, b] : lines) {
    if (!(a > 0) || !(b < 0)) continue;
    RopeConfig r = cfg.rope;
    r.type = RopeType::kLlama3;
    r.factor = factor;
    r.original_max_position_embeddings = orig_ctx;
    r.low_freq_factor = -b * old_ctx / a;
    r.high_freq_factor = r.low_freq_factor + old_ctx / a;
    bool ok = true;
    for (int64_t i = 0; i < n && ok; ++i)
      ok = std::abs(llama3_divisor(r, 1.0 / x[i]) - div[i]) <= 1e-4 * div[i];
    if (ok) {
      cfg.rope = r;
      return Status::ok_status();
    }
  }
  return unimplemented(where + " does not follow llama3's rope scaling formula; other per-frequency "
                       "rope factors are not supported");
}

}  // namespace

Result<ModelConfig> gguf_model_config(const GgufFile& f) {
  const std::string& p = f.path();
  PAGELLM_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  const ArchInfo* info = nullptr;
  for (const auto& a : kArchs)
    if (arch == a.gguf_arch) info = &a;
  if (!info)
    return unimplemented(p + ": general.architecture '" + arch +
                         "' is not supported (supported: llama, qwen2, qwen3)");
  if (f.has("split.count")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t n_split, f.get_i64("split.count"));
    if (n_split > 1) return unimplemented(p + ": split GGUF files are not supported (merge them with gguf-split --merge)");
  }
  ModelConfig cfg;
  cfg.architecture = info->hf_arch;
  cfg.model_type = info->model_type;
  cfg.source = p;
  const Meta m(f, arch);

  int64_t n_experts = 0;
  PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("expert_count"), 0, kMaxDim, n_experts));
  if (n_experts > 0)
    return unimplemented(p + ": metadata key '" + m.key("expert_count") + "' = " + std::to_string(n_experts) +
                         ": mixture-of-experts GGUF files are not supported");

  PAGELLM_RETURN_IF_ERROR(m.int_required(m.key("embedding_length"), 1, kMaxDim, cfg.hidden_size));
  PAGELLM_RETURN_IF_ERROR(m.int_required(m.key("block_count"), 1, kMaxLayers, cfg.num_hidden_layers));
  PAGELLM_RETURN_IF_ERROR(m.int_required(m.key("feed_forward_length"), 1, kMaxDim, cfg.intermediate_size));
  PAGELLM_RETURN_IF_ERROR(m.int_required(m.key("context_length"), 1, kMaxPositions, cfg.max_position_embeddings));
  PAGELLM_RETURN_IF_ERROR(m.int_required(m.key("attention.head_count"), 1, kMaxDim, cfg.num_attention_heads));
  cfg.num_key_value_heads = cfg.num_attention_heads;
  PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("attention.head_count_kv"), 1, kMaxDim, cfg.num_key_value_heads));
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    return invalid_argument(p + ": attention.head_count " + std::to_string(cfg.num_attention_heads) +
                            " is not a multiple of attention.head_count_kv " +
                            std::to_string(cfg.num_key_value_heads));
  if (!f.has(m.key("attention.key_length")) && cfg.hidden_size % cfg.num_attention_heads != 0)
    return invalid_argument(p + ": embedding_length " + std::to_string(cfg.hidden_size) +
                            " is not a multiple of attention.head_count and attention.key_length is absent");
  cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("attention.key_length"), 2, kMaxDim, cfg.head_dim));
  int64_t value_length = cfg.head_dim;
  PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("attention.value_length"), 1, kMaxDim, value_length));
  if (value_length != cfg.head_dim)
    return unimplemented(p + ": attention.value_length " + std::to_string(value_length) +
                         " differs from attention.key_length " + std::to_string(cfg.head_dim));
  if (cfg.head_dim % 2 != 0)
    return invalid_argument(p + ": head dimension " + std::to_string(cfg.head_dim) + " must be even");

  cfg.rms_norm_eps = 1e-5;  // llama.cpp's default when the key is absent
  PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps));
  if (f.has(m.key("attention.sliding_window"))) {
    // A window on every layer (Mistral). Qwen2/Qwen3 apply theirs per layer, which HF configs
    // describe and GGUF does not; refuse rather than guess.
    if (arch != "llama")
      return unimplemented(p + ": metadata key '" + m.key("attention.sliding_window") +
                           "' is not supported for " + arch);
    int64_t window = 0;
    PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("attention.sliding_window"), 1, kMaxPositions, window));
    cfg.sliding_window = window;
  }
  PAGELLM_RETURN_IF_ERROR(m.refuse_if_present(m.key("attention.clamp_kqv"), "clamped q/k/v"));

  // --- rope ---
  RopeConfig& rope = cfg.rope;
  PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("rope.freq_base"), rope.theta));
  int64_t rot_dim = cfg.head_dim;
  PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("rope.dimension_count"), 2, cfg.head_dim, rot_dim));
  if (rot_dim % 2 != 0)
    return invalid_argument(p + ": rope.dimension_count " + std::to_string(rot_dim) + " must be even");
  rope.partial_rotary_factor = static_cast<double>(rot_dim) / static_cast<double>(cfg.head_dim);
  std::string scaling = "none";
  if (f.has(m.key("rope.scaling.type"))) {
    PAGELLM_ASSIGN_OR_RETURN(scaling, f.get_string(m.key("rope.scaling.type")));
  }
  double factor = 0;
  PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("rope.scaling.factor"), factor));
  if (f.has(m.key("rope.scale_linear"))) {  // the key older converters wrote for linear scaling
    if (f.has(m.key("rope.scaling.type")))
      return invalid_argument(p + ": both rope.scale_linear and rope.scaling.type are present");
    PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("rope.scale_linear"), factor));
    scaling = factor == 1.0 ? "none" : "linear";
  }
  int64_t orig_ctx = cfg.max_position_embeddings;
  PAGELLM_RETURN_IF_ERROR(
      m.int_optional(m.key("rope.scaling.original_context_length"), 1, kMaxPositions, orig_ctx));
  if (scaling == "none") {
    rope.type = RopeType::kDefault;
  } else if (scaling == "linear") {
    if (factor == 0) return not_found(p + ": rope.scaling.type 'linear' needs " + m.key("rope.scaling.factor"));
    rope.type = RopeType::kLinear;
    rope.factor = factor;
  } else if (scaling == "yarn") {
    if (factor == 0) return not_found(p + ": rope.scaling.type 'yarn' needs " + m.key("rope.scaling.factor"));
    rope.type = RopeType::kYarn;
    rope.factor = factor;
    rope.original_max_position_embeddings = orig_ctx;
    PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("rope.scaling.yarn_beta_fast"), rope.beta_fast));
    PAGELLM_RETURN_IF_ERROR(m.positive_double(m.key("rope.scaling.yarn_beta_slow"), rope.beta_slow));
    // These change the attention scale or the ramp in ways HF's yarn for these families has no
    // field for; refuse rather than ignore.
    for (const char* k : {"rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor",
                          "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_log_multiplier"})
      PAGELLM_RETURN_IF_ERROR(m.refuse_if_present(m.key(k), "yarn variant"));
  } else {
    return unimplemented(p + ": metadata key '" + m.key("rope.scaling.type") + "' = '" + scaling +
                         "' is not supported (supported: none, linear, yarn)");
  }
  if (const GgufTensor* t = f.find_tensor("rope_freqs.weight"))
    PAGELLM_RETURN_IF_ERROR(fold_rope_freqs(f, *t, orig_ctx, cfg));

  // --- vocabulary and special tokens ---
  if (f.has(m.key("vocab_size"))) {
    PAGELLM_RETURN_IF_ERROR(m.int_optional(m.key("vocab_size"), 1, kMaxVocab, cfg.vocab_size));
  } else if (f.has("tokenizer.ggml.tokens")) {
    PAGELLM_ASSIGN_OR_RETURN(uint64_t n, f.get_array_size("tokenizer.ggml.tokens"));
    cfg.vocab_size = static_cast<int64_t>(n);
  } else if (const GgufTensor* t = f.find_tensor("token_embd.weight"); t && t->dims.size() == 2) {
    cfg.vocab_size = t->dims[1];
  }
  if (cfg.vocab_size <= 0 || cfg.vocab_size > kMaxVocab)
    return invalid_argument(p + ": cannot tell the vocabulary size (no " + m.key("vocab_size") +
                            ", tokenizer.ggml.tokens or token_embd.weight)");
  auto token_id = [&](const char* k) -> Result<std::optional<int32_t>> {
    if (!f.has(k)) return std::optional<int32_t>();
    PAGELLM_ASSIGN_OR_RETURN(uint32_t id, f.get_u32(k));
    if (id >= static_cast<uint64_t>(cfg.vocab_size))
      return out_of_range(p + ": metadata key '" + k + "' = " + std::to_string(id) + " is not below the vocabulary size " +
                          std::to_string(cfg.vocab_size));
    return std::optional<int32_t>(static_cast<int32_t>(id));
  };
  PAGELLM_ASSIGN_OR_RETURN(cfg.bos_token_id, token_id("tokenizer.ggml.bos_token_id"));
  PAGELLM_ASSIGN_OR_RETURN(cfg.pad_token_id, token_id("tokenizer.ggml.padding_token_id"));
  // Generation stops at eos and, when the file names them, end-of-turn / end-of-message tokens
  // (Llama 3 instruct files carry <|eot_id|> there).
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    PAGELLM_ASSIGN_OR_RETURN(std::optional<int32_t> id, token_id(k));
    if (id && std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), *id) == cfg.eos_token_ids.end())
      cfg.eos_token_ids.push_back(*id);
  }

  // --- what the tensors say ---
  cfg.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  auto has_all_layers = [&](const char* part) {
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
      if (!f.find_tensor("blk." + std::to_string(l) + "." + part)) return false;
    return true;
  };
  if (arch == "qwen2") {
    cfg.attention_bias = true;  // Qwen2 always has q/k/v biases and none on o_proj
  } else {
    cfg.attention_bias = has_all_layers("attn_q.bias");
    cfg.o_proj_bias = has_all_layers("attn_output.bias");
  }
  cfg.mlp_bias = has_all_layers("ffn_up.bias");
  cfg.qk_norm = arch == "qwen3";
  cfg.hidden_act = "silu";
  return cfg;
}

Result<LoadedCheckpoint> open_gguf_checkpoint(const std::string& gguf_path) {
  PAGELLM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(gguf_path));
  auto shared = std::make_shared<const GgufFile>(std::move(file));
  PAGELLM_ASSIGN_OR_RETURN(ModelConfig cfg, gguf_model_config(*shared));
  GgufWeightOptions opts;
  // Only the llama converter permutes q/k (to GGML's interleaved rope); qwen2/qwen3 keep HF's order.
  opts.unpermute_qk = cfg.model_type == "llama";
  opts.n_head = cfg.num_attention_heads;
  opts.n_head_kv = cfg.num_key_value_heads;
  PAGELLM_ASSIGN_OR_RETURN(std::unique_ptr<GgufWeightSource> weights, GgufWeightSource::create(shared, opts));
  LoadedCheckpoint ckpt;
  ckpt.config = std::move(cfg);
  ckpt.weights = std::move(weights);
  ckpt.gguf_path = gguf_path;
  return ckpt;
}

}  // namespace pagellm
