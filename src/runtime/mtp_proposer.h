// Multi-token-prediction proposals (--speculative-method mtp): DeepSeek-V3's MTP module
// (model.h's MtpModule) guesses from the target's own hidden states. Its entry at position j of
// a sequence is made from token j + 1 and the target's final hidden row at j, and predicts token
// j + 2; a guess after the first chains the module on its own output row and the guess before.
//
// So the module needs the target's hidden row of every position, which exist only during the
// target forward that computed them (Proposer::observe). Each sequence drafted for holds a slot:
// a KV cache of max_len positions for the module's layer, and a few staged rows. After each
// target forward, a row whose next token is known (a prompt's, or an output's) is turned into
// the module's entry at once, in one module forward for the whole step; a row whose next token
// is not known yet (the last, or a guess under verification) is copied to the slot's staging,
// until the next observe or proposal knows it. A proposal then turns the staged rows that held
// (the accepted guesses, and the position before the newest token) into entries, in one module
// forward for every sequence, whose last rows give the first guesses; each further guess is one
// more forward of every sequence still guessing, from the module's own output rows. So k
// guesses cost k module forwards whatever the batch, plus one per target step.
//
// A slot's positions are relative to the first position it saw (its base): RoPE makes attention
// depend on position differences only, so a sequence whose prompt came partly from the prefix
// cache (no hidden rows for the cached part), or whose rows were missed while speculation was
// off for a large batch, restarts its slot at the first row it has, with less context for its
// guesses and the same scores otherwise. Guesses never change outputs: the engine verifies them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/draft_picker.h"
#include "runtime/proposer_slots.h"
#include "runtime/step_batch.h"
#include "spec/proposer.h"

namespace pagellm {

class MtpProposer final : public Proposer {
 public:
  // `mtp` runs on `backend` (the target's), with a slot for each of max_seqs sequences of up to
  // max_len tokens, staging up to max_guesses + 2 rows each. `sampler`: the target's sampling
  // settings, for the drawn guesses.
  MtpProposer(MtpModule& mtp, Backend& backend, int32_t max_len, int32_t max_seqs,
              int32_t max_guesses, const SamplerConfig& sampler);
  ~MtpProposer() override;
  bool reads_hidden() const override { return true; }
  void observe(std::span<const TargetChunk> chunks, const Tensor& hidden) override;
  void propose(std::span<const ProposalRequest> batch) override;
  void release(uint64_t request_id) override;

 private:
  struct Slot {
    int32_t index = 0;  // its cache blocks and staging rows
    int32_t base = 0;   // the sequence position of the module's position 0
    int32_t done = 0;   // the module holds final entries for positions [base, base + done)
    // Target rows staged for positions [base + done, ...): each row's input token (-1: unknown).
    std::vector<int32_t> staged;
    int32_t frontier() const { return base + done; }
  };
  // One sequence's part of a module forward: entries [first, first + tokens.size()) of `slot`,
  // their input tokens (each position's next token) and hidden rows.
  struct Part {
    Slot* slot;
    int32_t first;
    std::vector<int32_t> tokens;
    std::vector<const char*> rows;
  };

  // The slot's staged row r, on the device.
  char* staged_row(const Slot& slot, int32_t r) const;
  // Adds to `part` the staged rows whose next token `token_at` knows (positions j with
  // j + 1 < known, the input token matching); returns how many. The slot is not changed.
  template <class TokenAt>
  int32_t take_staged(const Slot& slot, int32_t known, const TokenAt& token_at, Part& part);
  // Drops the slot's first n staged rows (moved into entries), keeping the rest first.
  void unstage(Slot& slot, int32_t n);
  // Runs `parts` through the module: their rows gathered into one hidden input, entries written
  // to the cache, and with `logits` each part's last row's logits (last_logits(), in order).
  void run(std::vector<Part>& parts, LogitsWanted logits);

  MtpModule& mtp_;
  Model& module_;
  Backend& backend_;
  int32_t max_len_;
  int32_t blocks_per_seq_;
  int32_t stage_rows_;  // per slot
  int64_t row_bytes_;   // one hidden row
  KvCache cache_;
  StepBatchBuilder builder_;
  std::vector<int32_t> tables_;        // every slot's block table, back to back
  std::unique_ptr<Buffer> staging_;    // [max_seqs * stage_rows_, D]
  std::unique_ptr<Buffer> hidden_in_;  // the next forward's hidden rows, grown as needed
  int64_t hidden_in_rows_ = 0;
  ProposerSlots<Slot> slots_;
  std::vector<DraftRow> draft_rows_;
  DraftPicker picker_;
};

}  // namespace pagellm
