// SequenceRunner: one sequence through a model with a private KV cache whose blocks are simply
// 0, 1, 2, ... — the simplest driver of Model::forward. `bench latency` and the golden tests use
// it; the serving engine (runtime/engine.h) runs many sequences over the shared block pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/logits_head.h"
#include "model/model.h"
#include "runtime/decode_graphs.h"
#include "runtime/step_batch.h"

namespace pagellm {

class SequenceRunner {
 public:
  // Room for max_len tokens. Prefill is split into chunks of at most max_chunk tokens so scratch
  // memory stays bounded whatever the prompt length.
  // One-token decode steps replay a recorded graph where the backend can record (use_graphs,
  // runtime/decode_graphs.h).
  SequenceRunner(Model& model, Backend& backend, int32_t max_len, int32_t block_size = 16,
                 int32_t max_chunk = 512, bool use_graphs = true);

  // Appends tokens to the sequence and runs them. Returns the logits (f32, row-major
  // [rows, vocab]) of the last token (kLast), of every fed token (kAll), or nothing (kNone).
  // Fails when the sequence would exceed max_len.
  Result<std::span<const float>> feed(std::span<const int32_t> tokens, LogitsWanted wanted);
  // The same with kLast, the logits left on the backend's device (act [1, vocab], valid until the
  // next feed): what a serving engine samples from on a device backend, with no download.
  Result<Tensor> feed_on_device(std::span<const int32_t> tokens);
  // feed_on_device() of one token that is still on the device: result row 0 of the sampling
  // call `ticket` (Backend::sample_async), read there, so this step is queued before that token
  // reaches the host.
  Result<Tensor> feed_sampled(uint64_t ticket);

  int32_t length() const { return length_; }
  int32_t max_len() const { return max_len_; }
  void reset() { length_ = 0; }

 private:
  Status check_tokens(std::span<const int32_t> tokens) const;
  SeqChunk chunk_at(std::span<const int32_t> tokens, size_t begin, LogitsWanted wanted);
  // Runs `tokens` (checked) on the device; negative ids are `sampled_ticket`'s tokens.
  Tensor run_on_device(std::span<const int32_t> tokens, uint64_t sampled_ticket);

  Model& model_;
  Backend& backend_;
  int32_t max_len_;
  int32_t max_chunk_;
  int32_t length_ = 0;
  int64_t vocab_;
  KvCache cache_;
  StepBatchBuilder builder_;
  std::vector<int32_t> block_table_;
  std::vector<float> logits_;
  std::unique_ptr<DecodeGraphs> graphs_;
  LogitsDownload download_{backend_};  // graph logits on their way to the host
};

}  // namespace pagellm
