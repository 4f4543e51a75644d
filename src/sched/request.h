// A request's bookkeeping in the scheduler: its state machine, its sequences (n parallel samples
// of one prompt) with their token ids, computed-token counts and KV block tables.
//
// State machine (RequestState):
//     kWaiting --admit--> kRunning --all sequences finish--> kFinished
//                         kRunning --out of KV blocks--> kPreempted --admit--> kRunning
//     any non-terminal state --abort(id) / cannot fit--> kAborted
// kPreempted is "waiting again after preemption": its blocks were freed (full blocks stay findable
// in the prefix cache) and it recomputes prompt + outputs when admitted again.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/finish_reason.h"
#include "kv/block_table.h"

namespace pagellm {

using RequestId = uint64_t;

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished, kAborted };

const char* request_state_name(RequestState state);
inline bool is_terminal(RequestState s) {
  return s == RequestState::kFinished || s == RequestState::kAborted;
}

// What add_request takes.
struct RequestSpec {
  RequestId id = 0;               // chosen by the caller, unique among live requests
  std::vector<int32_t> prompt;    // token ids, non-empty
  int32_t max_tokens = 16;        // output tokens per sequence, >= 1
  int32_t n = 1;                  // parallel samples sharing the prompt's KV blocks
  std::vector<uint64_t> extra_keys;  // LoRA id, multimodal hashes, cache salt: part of block hashes
  double arrival_ms = 0.0;        // the engine clock at arrival (dynamic batching's wait)
};

struct Sequence {
  int32_t index = 0;
  std::vector<int32_t> tokens;  // prompt, then this sequence's outputs
  // Leading tokens whose KV is in the cache, counting the tokens planned in the step in flight
  // (the scheduler advances it when it plans a step, as the step will write that KV).
  int32_t n_computed = 0;
  BlockTable table;
  FinishReason finish = FinishReason::kNone;
  // Resumed after preemption, waiting for the request's first live sequence (the leader) to
  // recompute the prompt's full blocks, which it then shares instead of recomputing them.
  bool parked = false;
  // Speculative decoding: the tokens guessed to follow (Scheduler::set_draft, for the next
  // schedule() only), and how many of them the step in flight verifies. Their KV positions
  // [n_computed, n_computed + n_draft_in_flight) hold blocks until the step's results say how
  // many guesses were right; the rest are released then.
  std::vector<int32_t> draft;
  int32_t n_draft_in_flight = 0;

  bool finished() const { return finish != FinishReason::kNone; }
  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t n_pending() const { return n_tokens() - n_computed; }
};

struct Request {
  RequestId id = 0;
  int32_t prompt_len = 0;
  int32_t max_tokens = 0;
  int32_t n = 1;
  uint64_t extra_hash = 0;   // hash_extra_keys(spec.extra_keys)
  uint64_t arrival_seq = 0;  // FCFS rank: order of add_request calls
  double arrival_ms = 0.0;
  RequestState state = RequestState::kWaiting;
  // False until the prompt's logits were sampled n times; until then only seqs[0] is computed, and
  // the other sequences are forked from it (sharing all its blocks) on that first sample.
  bool forked = false;
  std::vector<Sequence> seqs;  // n of them
  int32_t n_cached_tokens = 0;  // prompt tokens served by the prefix cache at first admission
  bool admitted_once = false;
  int32_t n_preemptions = 0;
  uint64_t batch_id = 0;     // static/dynamic batching: the batch this request belongs to
  std::string error;         // why the scheduler failed it (state kAborted)

  int32_t n_live() const;    // sequences not finished
  // The sequences the scheduler computes now: all live unparked ones once forked, else seqs[0].
  bool is_active(const Sequence& s) const {
    return !s.finished() && !s.parked && (forked || s.index == 0);
  }
  bool has_parked() const;
  std::span<const int32_t> output(int32_t seq_index) const;
};

}  // namespace pagellm
