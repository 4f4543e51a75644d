// ModelConfig: every hyper-parameter that changes the math, parsed from a Hugging Face config.json
// (classic keys and transformers 5's rope_parameters) or from GGUF metadata. A field we do not
// implement is refused at parse time with an error naming it; it never silently changes nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/quant_config.h"

namespace pagellm {

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;  // linear / dynamic / llama3 / yarn scaling factor
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;  // llama3, yarn, dynamic (0: use max_position)
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;  // yarn: explicit mscale override
  std::optional<double> mscale;            // DeepSeek yarn
  std::optional<double> mscale_all_dim;    // DeepSeek yarn
  bool truncate = true;                    // yarn: round the correction range (HF default true)
  double partial_rotary_factor = 1.0;      // fraction of head_dim that is rotated
  bool interleaved = false;  // rotate pairs (2i, 2i+1) instead of halves (DeepSeek-V2 q/k_pe)
};

// How a mixture-of-experts router picks each token's experts (DeepSeek's topk_method).
enum class MoeTopk {
  kGreedy,              // the top-k scores
  kGroupLimitedGreedy,  // top-k within the topk_group groups with the best max score (V2)
  kNoauxTc,             // V3: groups ranked by their top-2 (score + e_score_correction_bias)
                        // sum; experts chosen by score + bias, weighted by the raw score
};
enum class MoeScoring { kSoftmax, kSigmoid };

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // explicit (Qwen3) or hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v projections (Qwen2: true; Llama: attention_bias)
  bool o_proj_bias = false;     // bias on o_proj (Llama's attention_bias covers o_proj too)
  bool mlp_bias = false;
  bool qk_norm = false;         // Qwen3: RMSNorm over each head of q and k before RoPE
  std::optional<int64_t> sliding_window;  // Mistral / Qwen2 with use_sliding_window
  RopeConfig rope;

  // Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank > 0 marks an MLA model. Queries are
  // [qk_nope_head_dim | qk_rope_head_dim] per head; the KV cache holds one latent row per token:
  // kv_lora_rank compressed values + the qk_rope_head_dim shared rotary key.
  std::optional<int64_t> q_lora_rank;  // unset: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // Mixture of experts (DeepSeekMoE, Mixtral); n_routed_experts > 0 marks an MoE model.
  int64_t n_routed_experts = 0;       // Mixtral: num_local_experts
  int64_t n_shared_experts = 0;       // always-on experts of moe_intermediate_size each
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // Mixtral: intermediate_size
  int64_t first_k_dense_replace = 0;  // layers [0, k) use a dense MLP
  int64_t moe_layer_freq = 1;         // only 1 is supported (every layer from k on is MoE)
  double routed_scaling_factor = 1.0;
  MoeTopk topk_method = MoeTopk::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;  // renormalize the chosen weights to sum to 1 (Mixtral: always)
  MoeScoring scoring_func = MoeScoring::kSoftmax;
  int64_t num_nextn_predict_layers = 0;  // DeepSeek-V3 multi-token prediction (not run)

  // Generation defaults (generation_config.json / GGUF tokenizer metadata).
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;

  // The checkpoint's 4-bit packing (config.json quantization_config); unset: float weights.
  std::optional<QuantConfig> quantization;

  // Where the weights came from, for messages.
  std::string source;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t rotary_dim() const {
    return static_cast<int64_t>(head_dim * rope.partial_rotary_factor);
  }
};

// Parses config.json text (path is only used in messages). Validates ranges and refuses fields
// that change the math and are not implemented.
Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& path);
// Reads DIR/config.json and, if present, DIR/generation_config.json.
Result<ModelConfig> load_hf_config(const std::string& model_dir);
// Merges generation_config.json (eos/bos/pad ids) into cfg.
Status apply_generation_config(const std::string& json_text, const std::string& path,
                               ModelConfig& cfg);

// Human-readable dump for `pagellm inspect`.
std::string describe(const ModelConfig& cfg);

}  // namespace pagellm
