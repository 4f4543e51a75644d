// DecoderModel: what every decoder-only architecture here shares beside its layers: the config
// and backend, the embedding table, the final norm and the LM head with the LogitsHead that turns
// the step's last hidden rows into logits, and the weight accounting (bytes held, and bytes one
// decode step reads). Each architecture file derives from it and adds its layers, scratch,
// prepare() and compute().
#pragma once

#include <cstdint>

#include "model/logits_head.h"
#include "model/model.h"

namespace pagellm {

class DecoderModel : public Model {
 public:
  const ModelConfig& config() const override { return cfg_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  // Every matrix but the embedding table (a step gathers one row of it), the LM head even when it
  // is that table, and of MoE layers only the top-k routed experts a batch-1 step reads.
  int64_t decode_weight_bytes() const override {
    const int64_t embed = dtype_bytes(embed_tokens_.dtype, embed_tokens_.numel());
    const int64_t head = dtype_bytes(lm_head_.dtype, lm_head_.numel());
    return weight_bytes_ - embed + (lm_head_.data == embed_tokens_.data ? head : 0) -
           unrouted_expert_bytes_;
  }
  Tensor last_logits() const override { return head_.logits(); }
  void download_logits(float* out) override { head_.download(out); }

 protected:
  DecoderModel(const ModelConfig& cfg, Backend& backend) : cfg_(cfg), backend_(backend) {}

  ModelConfig cfg_;
  Backend& backend_;
  Tensor embed_tokens_, norm_, lm_head_;
  int64_t weight_bytes_ = 0;           // set by the architecture's load()
  int64_t unrouted_expert_bytes_ = 0;  // MoE: the experts beyond top-k, over all layers
  LogitsHead head_{backend_};
};

}  // namespace pagellm
