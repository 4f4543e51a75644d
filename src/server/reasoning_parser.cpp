#include "server/reasoning_parser.h"

#include <algorithm>

namespace pagellm::server {
namespace {

constexpr std::string_view kStart = "<think>";
constexpr std::string_view kEnd = "</think>";

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that may
// be the start of a marker whose rest has not come yet.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

Result<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name.empty()) return ReasoningFormat::kNone;
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  return invalid_argument("--reasoning-parser must be deepseek_r1 or qwen3, got '" +
                          std::string(name) + "'");
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format)
    : format_(format), state_(format == ReasoningFormat::kNone ? State::kContent : State::kStart) {}

void ReasoningSplitter::add(Piece& out, State state, std::string_view text) {
  (state == State::kReasoning ? out.reasoning : out.content).append(text);
}

void ReasoningSplitter::scan(Piece& out) {
  if (state_ == State::kStart) {
    // Whether the answer opens with <think>: undecided while it is a prefix of the marker.
    if (pending_.size() < kStart.size() && kStart.substr(0, pending_.size()) == pending_) return;
    const bool opens = pending_.compare(0, kStart.size(), kStart) == 0;
    if (opens) pending_.erase(0, kStart.size());
    state_ = opens || format_ == ReasoningFormat::kDeepSeekR1 ? State::kReasoning : State::kContent;
  }
  if (state_ == State::kReasoning) {
    const size_t end = pending_.find(kEnd);
    if (end != std::string::npos) {
      add(out, State::kReasoning, std::string_view(pending_).substr(0, end));
      pending_.erase(0, end + kEnd.size());
      state_ = State::kContent;
    } else {
      const size_t keep = partial_marker(pending_, kEnd);
      add(out, State::kReasoning, std::string_view(pending_).substr(0, pending_.size() - keep));
      pending_.erase(0, pending_.size() - keep);
      return;
    }
  }
  add(out, State::kContent, pending_);
  pending_.clear();
}

ReasoningSplitter::Piece ReasoningSplitter::feed(std::string_view text) {
  Piece out;
  pending_.append(text);
  scan(out);
  return out;
}

ReasoningSplitter::Piece ReasoningSplitter::finish() {
  Piece out;
  if (state_ == State::kStart) {
    // Ended while it could still have been <think>: a thought of nothing (R1) or plain text.
    state_ = format_ == ReasoningFormat::kDeepSeekR1 ? State::kReasoning : State::kContent;
  }
  add(out, state_, pending_);  // a partial end marker is text of the state it is in
  pending_.clear();
  return out;
}

}  // namespace pagellm::server
