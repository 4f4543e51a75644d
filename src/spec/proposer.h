// Speculative decoding's proposers: guesses of a sequence's next tokens, which the target model
// then checks all at once in one forward pass (runtime/engine.cpp verifies them). A proposer only
// guesses: a wrong guess costs the verification's extra positions, never the output, which the
// verification makes identical to decoding without speculation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagellm {

// One sequence that wants a proposal this step.
struct ProposalRequest {
  uint64_t request_id = 0;
  int32_t seq_index = 0;
  std::span<const int32_t> tokens;        // prompt, then the outputs so far (the last one included)
  int32_t max_tokens = 0;                 // at most this many draft tokens, >= 1
  std::vector<int32_t>* draft = nullptr;  // out: the guesses, in order (empty: no guess)
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills every request's draft. Batched, so that a proposer that runs a model can run one
  // forward pass for all of them.
  virtual void propose(std::span<const ProposalRequest> batch) = 0;
  // The request ended (finished, aborted or preempted): any state kept for it can go.
  virtual void release(uint64_t request_id) { (void)request_id; }
};

}  // namespace pagellm
