// Speculative decoding's proposers: guesses of a sequence's next tokens, which the target model
// then checks all at once in one forward pass (runtime/engine.cpp verifies them). A proposer only
// guesses: a wrong guess costs the verification's extra positions, never the output. Deterministic
// guesses (prompt lookup, a draft model's argmax) are verified exactly: outputs identical to
// decoding without speculation. A proposer with distributions may instead draw the guesses of a
// sampled request from them and say what they were (draft_probs); the rejection sampler
// (sample/rejection_sampler.h) verifies those, keeping the target's distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "sample/logits_processors.h"
#include "sample/sampling_params.h"

namespace pagellm {

// One sequence that wants a proposal this step.
struct ProposalRequest {
  uint64_t request_id = 0;
  int32_t seq_index = 0;
  std::span<const int32_t> tokens;        // prompt, then the outputs so far (the last one included)
  int32_t max_tokens = 0;                 // at most this many draft tokens, >= 1
  std::vector<int32_t>* draft = nullptr;  // out: the guesses, in order (empty: no guess)
  // A request that samples: a proposer with distributions draws guess j from its own, processed
  // with these params as the target's row is (tokens[0, n_prompt) the prompt, the rest and the
  // guesses before j the history, the sequence's seed), and appends it to *draft_probs. Null
  // params: deterministic guesses, draft_probs left empty.
  const SamplingParams* params = nullptr;
  int32_t n_prompt = 0;
  uint64_t seed = 0;
  std::vector<std::vector<TokenProb>>* draft_probs = nullptr;  // out, one per guess, or empty
};

// One sequence's part of a target forward, for a proposer that reads the target's hidden states
// (Proposer::observe).
struct TargetChunk {
  uint64_t request_id = 0;
  int32_t seq_index = 0;
  int32_t start_pos = 0;  // the chunk fed positions [start_pos, start_pos + n_tokens)
  int32_t n_tokens = 0;
  int64_t first_row = 0;  // of the forward's hidden rows, the chunk's first
  // The chunk's input tokens; negative: one the host does not know yet (a step planned before
  // the one in flight was read). The tokens after the first may be guesses under verification.
  const int32_t* tokens = nullptr;
  // The sequence's tokens known for certain now: the prompt, then its outputs so far.
  std::span<const int32_t> prompt, outputs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Whether observe() wants every target forward's hidden rows.
  virtual bool reads_hidden() const { return false; }
  // After a target forward, before the next: its chunks and hidden rows (Model::last_hidden).
  // The rows are valid until the next target forward, so what the proposer keeps it copies.
  virtual void observe(std::span<const TargetChunk> chunks, const Tensor& hidden) {
    (void)chunks;
    (void)hidden;
  }
  // Fills every request's draft. Batched, so that a proposer that runs a model can run one
  // forward pass for all of them.
  virtual void propose(std::span<const ProposalRequest> batch) = 0;
  // The request ended (finished, aborted or preempted): any state kept for it can go.
  virtual void release(uint64_t request_id) { (void)request_id; }
};

}  // namespace pagellm
