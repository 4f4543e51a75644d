// Model: one architecture's forward pass over a ragged batch, written against the Backend op
// interface. The engine (runtime/) plans a step, packs it into a StepBatch and calls forward();
// the model writes the new tokens' K/V into the paged cache and returns logits for the rows that
// need them. Architectures register themselves by their config "architectures" name.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model_config.h"
#include "io/weights.h"

namespace pagellm {

// Geometry of the paged KV cache a model needs, per layer.
struct KvSpec {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;  // 1 for MLA's latent row
  int64_t k_dim = 0;       // per head (MLA: kv_lora_rank + rope dim)
  int64_t v_dim = 0;       // per head; 0 when V lives inside the K row (MLA)
  // Bytes of one token's K and V in one layer at `elem_bytes` per value.
  int64_t token_bytes_per_layer(int64_t elem_bytes) const {
    return n_kv_heads * (k_dim + v_dim) * elem_bytes;
  }
};

// The device-side paged KV cache: per layer, K [n_blocks, block_size, n_kv_heads, k_dim] and
// V [n_blocks, block_size, n_kv_heads, v_dim] in the backend's activation dtype, or both in
// float8_e4m3fn (--kv-cache-dtype fp8) with a scale per layer for keys and one for values.
struct KvCache {
  int32_t block_size = 16;
  int64_t n_blocks = 0;
  std::vector<Tensor> k;  // per layer
  std::vector<Tensor> v;  // per layer (undefined for MLA)
  std::vector<std::unique_ptr<Buffer>> storage;
  // An FP8 cache's per-layer scales (Backend::rope_store_kv); empty: 1.
  std::vector<float> k_scales, v_scales;

  float k_scale(size_t layer) const { return layer < k_scales.size() ? k_scales[layer] : 1.0f; }
  float v_scale(size_t layer) const { return layer < v_scales.size() ? v_scales[layer] : 1.0f; }
  // `p` with layer `layer`'s scales, for the attention ops.
  AttentionParams params(size_t layer, AttentionParams p) const {
    p.k_scale = k_scale(layer);
    p.v_scale = v_scale(layer);
    return p;
  }

  // `dtype`: the elements' (the backend's activation dtype, or kF8E4M3).
  static KvCache allocate(Backend& backend, const KvSpec& spec, int32_t block_size,
                          int64_t n_blocks, DType dtype);
  static KvCache allocate(Backend& backend, const KvSpec& spec, int32_t block_size,
                          int64_t n_blocks) {
    return allocate(backend, spec, block_size, n_blocks, backend.activation_dtype());
  }
  static int64_t bytes_per_block(const KvSpec& spec, int32_t block_size, DType dtype);
};

// One step's ragged batch, already on the backend's device (built by runtime/step_batch.h).
// Sequences are packed back to back: sequence s owns tokens [cu_seqlens_q[s], cu_seqlens_q[s+1]).
struct StepBatch {
  int32_t n_tokens = 0;
  Tensor token_ids;     // i32 [n_tokens]
  Tensor slot_mapping;  // i32 [n_tokens]
  AttentionMeta attn;   // cu_seqlens_q, seq_lens_kv, block_tables on the device
  Tensor logits_rows;   // i32 [n_logits]: token rows whose logits are wanted, in output order
  int32_t n_logits = 0;
  // logits_rows is 0, 1, ..., n_tokens - 1 (a decode step): the LM head reads the hidden rows
  // where they are, with no gather (model/logits_head.h).
  bool logits_every_token = false;
  // Host copies the model needs for planning (RoPE tables are computed on the host).
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int32_t> cu_seqlens_q;  // [n_seqs + 1]
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvSpec kv_spec() const = 0;
  // Runs the batch: prepare(), compute(), and with logits_out (host f32 [batch.n_logits,
  // vocab_size]) the logits copied there; with nullptr they stay on the device, in last_logits().
  virtual void forward(const StepBatch& batch, KvCache& cache, float* logits_out) {
    prepare(batch);
    compute(batch, cache);
    if (logits_out != nullptr && batch.n_logits > 0) download_logits(logits_out);
  }
  // The last forward's logits on the backend's device: [n_logits, vocab_size], activation dtype.
  // Valid until the next forward.
  virtual Tensor last_logits() const = 0;
  // Copies last_logits() to host f32 [n_logits, vocab_size] and waits.
  virtual void download_logits(float* out) = 0;
  // CUDA graphs (runtime/decode_graphs.h): every architecture splits its step into host-side
  // preparation (per-step tables uploaded into scratch that does not move) and pure device work,
  // so the decode-graph runner can record compute() once per batch size and replay it.
  // Sizes scratch for the batch and uploads its per-step tables (RoPE). Not recordable.
  virtual void prepare(const StepBatch& batch) = 0;
  // Every device op of the step, ending with the logits in last_logits(). Recordable once the
  // same shapes have run directly (scratch and workspaces sized).
  virtual void compute(const StepBatch& batch, KvCache& cache) = 0;
  // Speculative decoding with a multi-token-prediction module (MtpModule below): every token's
  // hidden row of the last forward, [rows >= n_tokens, hidden_size] in the activation dtype on
  // the backend's device, row i token i's; valid until the next forward: what the LM head reads,
  // after the final norm (an MTP module's: after its shared head's norm). Undefined where the
  // architecture exports none.
  virtual Tensor last_hidden() const { return Tensor(); }
  // Bytes of weights held on the backend's device (or mapped, on CPU).
  virtual int64_t weight_bytes() const = 0;
  // Weight bytes one decode step reads: every matrix but the embedding table (one row of it is
  // gathered), plus the LM head even when it shares the table. The floor of a batch-1 step.
  virtual int64_t decode_weight_bytes() const = 0;

  // Per layer (key, value) scales of an FP8 KV cache that the checkpoint carries
  // (io/kv_cache_scales.h); empty when it has none (scales of 1). Set by load_model().
  const std::vector<std::pair<float, float>>& kv_cache_scales() const { return kv_cache_scales_; }
  void set_kv_cache_scales(std::vector<std::pair<float, float>> s) {
    kv_cache_scales_ = std::move(s);
  }

 private:
  std::vector<std::pair<float, float>> kv_cache_scales_;
};

struct LoadOptions {
  // Storage type for dense weights on device backends; kF32 on CPU means "keep as stored".
  DType weight_dtype = DType::kBF16;
  // With dummy weights (--load-format dummy --quantization): the quantized type of the decoder's
  // projections (io/quant_config.h's is_quantized_projection) whose rows it fits; kF32: none.
  DType dummy_quantized = DType::kF32;
};

using ModelFactory = std::function<Result<std::unique_ptr<Model>>(
    const LoadedCheckpoint&, Backend&, const LoadOptions&)>;

// Registers a factory for an architecture name ("LlamaForCausalLM"); called at static init by
// each architecture file.
bool register_architecture(const std::string& name, ModelFactory factory);
std::vector<std::string> registered_architectures();

// Builds the model named by ckpt.config.architecture, or an error listing the supported ones.
Result<std::unique_ptr<Model>> load_model(const LoadedCheckpoint& ckpt, Backend& backend,
                                          const LoadOptions& options = {});

// A multi-token-prediction module (DeepSeek-V3's MTP layer, num_nextn_predict_layers of them
// after the decoder layers): a one-layer decoder beside the target model that predicts the token
// after next. Its input at position j is the embedding of token j + 1 and a hidden row: the
// target's final hidden state at j (the target's last_hidden()), or, chained for further guesses,
// the module's own at j (its last_hidden(), normalized alike). It shares the target's embedding
// table and LM head, and has its own KV cache of kv_spec() (one layer). runtime/mtp_proposer.h
// drives it.
class MtpModule {
 public:
  virtual ~MtpModule() = default;
  // The module as a model: forward() runs its layer for a batch, whose rows pair with the hidden
  // rows set last.
  virtual Model& model() = 0;
  // The hidden rows paired with the next forward's tokens: act [>= n_tokens, hidden_size] on the
  // backend's device, read by that forward. (So the module runs op by op: a recorded graph would
  // read the rows set when it was recorded.)
  virtual void set_hidden_input(const Tensor& rows) = 0;
};

// The first multi-token-prediction layer of `ckpt` on `backend`, beside `target` (loaded from the
// same checkpoint, and outliving the module), or an error when the architecture or checkpoint
// has none.
Result<std::unique_ptr<MtpModule>> load_mtp_module(const LoadedCheckpoint& ckpt, Backend& backend,
                                                   Model& target, const LoadOptions& options = {});

}  // namespace pagellm
