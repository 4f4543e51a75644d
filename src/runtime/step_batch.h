// Packs one step's ragged batch into a StepBatch on the backend's device: token ids, slot
// mapping, cu_seqlens, KV lengths, block tables and logits rows go up in ONE host-to-device copy
// from a reused staging buffer (the hot loop makes no other uploads).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace pagellm {

enum class LogitsWanted : uint8_t {
  kNone,  // a prefill chunk that is not the prompt's last
  kLast,  // the last token of the chunk (decode, or the prompt's final chunk)
  kAll,   // every token (prompt logprobs)
};

// One sequence's share of a step: tokens [start_pos, start_pos + n_tokens) of the sequence, whose
// earlier tokens are already in the cache.
struct SeqChunk {
  const int32_t* tokens = nullptr;
  int32_t n_tokens = 0;
  int32_t start_pos = 0;
  const int32_t* block_table = nullptr;  // physical block of each logical block
  int32_t n_blocks = 0;                  // must cover start_pos + n_tokens
  LogitsWanted logits = LogitsWanted::kLast;
};

class StepBatchBuilder {
 public:
  StepBatchBuilder(Backend& backend, int32_t block_size);
  // The returned batch's device tensors stay valid until the next build(). With a sampling
  // ticket, negative token ids are that call's sampled tokens, taken on the device once the ids
  // are up (Backend::take_sampled_tokens): a step planned before its input tokens were read.
  const StepBatch& build(const std::vector<SeqChunk>& seqs, uint64_t sampled_ticket = 0);

  // A decode step laid out for a recorded graph (runtime/decode_graphs.h): `seqs` (one token each)
  // followed by padding up to `n_seqs` sequences, and block tables `table_width` entries wide, so
  // that for a given n_seqs every device array sits at the same address step after step (the
  // device buffer only grows, and a first build at the largest n_seqs sizes it). Padding sequences
  // have token 0, no context and slot -1 (nothing is stored); their logits rows are computed and
  // ignored. Attention is planned for contexts up to max_context.
  // Sampled tokens as in build().
  const StepBatch& build_padded(const std::vector<SeqChunk>& seqs, int32_t n_seqs,
                                int32_t table_width, int32_t max_context,
                                uint64_t sampled_ticket = 0);

 private:
  const StepBatch& pack(const std::vector<SeqChunk>& seqs, int32_t n_pad, int32_t table_width,
                        int32_t max_context, uint64_t sampled_ticket);

  Backend& backend_;
  int32_t block_size_;
  std::vector<int32_t> staging_;
  std::unique_ptr<Buffer> device_;
  StepBatch batch_;
};

}  // namespace pagellm
