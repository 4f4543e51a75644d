#include "sched/request.h"

namespace pagellm {

const char* request_state_name(RequestState state) {
  switch (state) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kRunning: return "running";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinished: return "finished";
    case RequestState::kAborted: return "aborted";
  }
  return "?";
}

int32_t Request::n_live() const {
  int32_t k = 0;
  for (const Sequence& s : seqs) k += s.finished() ? 0 : 1;
  return k;
}

bool Request::has_parked() const {
  for (const Sequence& s : seqs) {
    if (s.parked) return true;
  }
  return false;
}

std::span<const int32_t> Request::output(int32_t seq_index) const {
  const Sequence& s = seqs.at(seq_index);
  return std::span<const int32_t>(s.tokens).subspan(prompt_len);
}

}  // namespace pagellm
