// Prompt lookup (n-gram) proposals: when the last n tokens of a sequence occurred before in it,
// the tokens that followed that earlier occurrence are the guess. No model: strong wherever the
// output copies from the input (code edits, quoting a document, summaries, RAG answers).
//
// For n from max_n down to min_n, the most recent earlier occurrence of the sequence's last n
// tokens is found; the first n with one gives the proposal: up to max_tokens tokens after it
// (fewer where the sequence ends first). A scan backwards over the sequence: O(length) per
// proposal, a few microseconds for thousands of tokens, no index to keep.
#pragma once

#include "spec/proposer.h"

namespace pagellm {

struct NgramConfig {
  int32_t min_n = 2;  // shortest suffix looked up (the --prompt-lookup-min default)
  int32_t max_n = 4;  // longest suffix looked up (tried first)
};

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(const NgramConfig& config);
  void propose(std::span<const ProposalRequest> batch) override;

  // One sequence's proposal (what propose() does for each request).
  static void propose_one(std::span<const int32_t> tokens, int32_t max_tokens,
                          const NgramConfig& config, std::vector<int32_t>& draft);

 private:
  NgramConfig config_;
};

}  // namespace pagellm
