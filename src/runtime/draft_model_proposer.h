// Draft-model proposals: a smaller model of the same vocabulary (--speculative-model) decodes a
// few tokens ahead of each sequence, greedily, and those are the guesses. Greedy guesses are
// deterministic, so the engine's verification (each position sampled as plain decoding samples
// it, a guess kept where it equals that token) leaves outputs unchanged at any temperature; a
// guess is right with the target's probability of the draft's top token.
//
// Each sequence has its own SequenceRunner (a private KV cache of max_len tokens) that keeps the
// tokens it has seen: a proposal feeds only what is new since the last (the tokens accepted
// since, after the runner forgets its own guesses that were wrong), then decodes k - 1 more.
// Runners of finished requests are kept for the next ones (at most max_runners, the most
// sequences the engine drafts for at once), so their caches are allocated once.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/sequence_runner.h"
#include "spec/proposer.h"

namespace pagellm {

class DraftModelProposer final : public Proposer {
 public:
  // `draft` runs on `backend` (the target's). max_len: the longest sequence (the engine's
  // max_model_len).
  DraftModelProposer(Model& draft, Backend& backend, int32_t max_len, int32_t max_runners);
  void propose(std::span<const ProposalRequest> batch) override;
  void release(uint64_t request_id) override;

  // Bytes of KV cache one runner holds (max_len tokens of the draft model).
  static int64_t runner_cache_bytes(const Model& draft, const Backend& backend, int32_t max_len);

 private:
  struct Runner {
    std::unique_ptr<SequenceRunner> runner;
    std::vector<int32_t> fed;  // the tokens the runner's cache holds, in order
  };
  Runner& runner_for(uint64_t request_id, int32_t seq_index);
  // The draft's next token after what `r` was fed last, greedy: on the device when the backend
  // samples there (only the token comes back), else from the downloaded logits.
  int32_t next_token(Runner& r, std::span<const int32_t> tokens);

  Model& draft_;
  Backend& backend_;
  int32_t max_len_;
  int32_t max_runners_;
  std::map<std::pair<uint64_t, int32_t>, Runner> live_;
  std::vector<Runner> spare_;
};

}  // namespace pagellm
