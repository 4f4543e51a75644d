// Draft-model proposals: a smaller model of the same vocabulary (--speculative-model) decodes a
// few tokens ahead of each sequence, and those are the guesses. For a greedy request it decodes
// greedily: deterministic guesses, which the engine verifies exactly (outputs unchanged). For a
// request that samples it draws each guess from its own distribution, processed with the
// request's sampling settings as the target's is, and hands the distributions over: the
// rejection sampler keeps a guess with probability min(1, p/q), which for a draft close to the
// target is far more often than the target's probability of the draft's top token.
//
// Every sequence drafted for holds a slot of the draft's own KV cache (max_len tokens, allocated
// once for max_seqs slots) and the tokens the slot holds. A proposal first forgets the slot's
// guesses that turned out wrong, then runs all the batch's sequences together: one forward for
// what each has new since its last proposal (the tokens accepted since), then one per further
// guess, each a decode step of every sequence still guessing. So k guesses for n sequences cost k
// forwards of the draft, whatever n. On a device the decode steps replay recorded graphs
// (runtime/decode_graphs.h): a small draft's step is launch-bound op by op.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/decode_graphs.h"
#include "runtime/draft_picker.h"
#include "runtime/proposer_slots.h"
#include "runtime/step_batch.h"
#include "spec/proposer.h"

namespace pagellm {

class DraftModelProposer final : public Proposer {
 public:
  // `draft` runs on `backend` (the target's), with a KV cache for max_seqs sequences of up to
  // max_len tokens (the engine's max_model_len).
  // `sampler`: the target's sampling settings (vocabulary, EOS ids), for the drawn guesses;
  // `graphs`: replay decode steps from recorded graphs where the backend can (no --enforce-eager).
  DraftModelProposer(Model& draft, Backend& backend, int32_t max_len, int32_t max_seqs,
                     const SamplerConfig& sampler, bool graphs);
  ~DraftModelProposer() override;
  void propose(std::span<const ProposalRequest> batch) override;
  void release(uint64_t request_id) override;

 private:
  struct Slot {
    int32_t index = 0;         // its blocks: [index * blocks_per_seq_, (index + 1) * ...)
    std::vector<int32_t> fed;  // the tokens its cache holds, in order
  };
  // A sequence being drafted for in propose().
  struct Work {
    const ProposalRequest* p;
    Slot* slot;
    std::vector<int32_t> history;  // a sampled request's: its outputs, then the guesses so far
  };
  // The chunk of `slot` that feeds tokens[0, n) at its end, wanting `logits`.
  SeqChunk chunk(Slot& slot, const int32_t* tokens, int32_t n, LogitsWanted logits);
  // One forward of `chunks`: all of them wanting their last logits row, or none (a catch-up,
  // work empty). next[i] becomes chunk i's next token: work[i]'s draw when its request samples,
  // else the greedy one (-1: none, as argmax_token and the device's greedy row say). On the
  // device when the backend samples there and no request samples (only the tokens come back),
  // else from the logits downloaded.
  void step(const std::vector<SeqChunk>& chunks, std::vector<Work>& work,
            std::vector<int32_t>& next);

  Model& draft_;
  Backend& backend_;
  int32_t max_len_;
  int32_t blocks_per_seq_;
  KvCache cache_;
  StepBatchBuilder builder_;
  std::vector<int32_t> tables_;                        // every slot's block table, back to back
  ProposerSlots<Slot> slots_;
  std::vector<DraftRow> rows_;
  DraftPicker picker_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step op by op
};

}  // namespace pagellm
