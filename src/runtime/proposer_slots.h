// The per-sequence slots of a proposer that keeps state for each sequence it guesses for (a
// draft model's cache, an MTP module's): a fixed number of slots, allocated with the proposer,
// each held by one (request, sequence) from its first use until the request is released.
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace pagellm {

// Slot: the proposer's per-sequence state, with an `int32_t index` naming its slot.
template <class Slot>
class ProposerSlots {
 public:
  explicit ProposerSlots(int32_t n) {
    for (int32_t i = n - 1; i >= 0; --i) free_.push_back(i);
  }
  // The sequence's slot; if it has none, a fresh one when `create` and one is free (more
  // sequences than slots: the others get no guesses), else null.
  Slot* find(uint64_t request_id, int32_t seq_index, bool create) {
    auto it = live_.find({request_id, seq_index});
    if (it != live_.end()) return &it->second;
    if (!create || free_.empty()) return nullptr;
    Slot slot{};
    slot.index = free_.back();
    free_.pop_back();
    return &live_.emplace(std::pair(request_id, seq_index), std::move(slot)).first->second;
  }
  // The request ended (finished, aborted or preempted): its sequences' slots are free again.
  void release(uint64_t request_id) {
    auto it = live_.lower_bound(std::pair(request_id, INT32_MIN));
    while (it != live_.end() && it->first.first == request_id) {
      free_.push_back(it->second.index);
      it = live_.erase(it);
    }
  }

 private:
  std::map<std::pair<uint64_t, int32_t>, Slot> live_;  // by (request, sequence)
  std::vector<int32_t> free_;
};

}  // namespace pagellm
