#include "runtime/sequence_runner.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace pagellm {

SequenceRunner::SequenceRunner(Model& model, Backend& backend, int32_t max_len,
                               int32_t block_size, int32_t max_chunk, bool use_graphs)
    : model_(model),
      backend_(backend),
      max_len_(max_len),
      max_chunk_(std::max(1, max_chunk)),
      vocab_(model.config().vocab_size),
      builder_(backend, block_size) {
  const int64_t n_blocks = (max_len + block_size - 1) / block_size;
  cache_ = KvCache::allocate(backend, model.kv_spec(), block_size, n_blocks);
  block_table_.resize(n_blocks);
  std::iota(block_table_.begin(), block_table_.end(), 0);
  if (use_graphs) graphs_ = DecodeGraphs::create(model, backend, cache_, block_size, 1, max_len);
}

Status SequenceRunner::check_tokens(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return invalid_argument("feed: no tokens");
  if (length_ + static_cast<int64_t>(tokens.size()) > max_len_) {
    return out_of_range("sequence of " + std::to_string(length_ + tokens.size()) +
                        " tokens exceeds the runner's " + std::to_string(max_len_));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_)
      return out_of_range("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                          std::to_string(vocab_) + ")");
  }
  return Status::ok_status();
}

// The chunk of at most max_chunk_ tokens from `begin`, continuing the sequence; `wanted` asks
// for the last chunk's last row (kLast) or every row (kAll).
SeqChunk SequenceRunner::chunk_at(std::span<const int32_t> tokens, size_t begin,
                                  LogitsWanted wanted) {
  const int32_t n = static_cast<int32_t>(std::min<size_t>(max_chunk_, tokens.size() - begin));
  const bool last_chunk = begin + n == tokens.size();
  SeqChunk c;
  c.tokens = tokens.data() + begin;
  c.n_tokens = n;
  c.start_pos = length_;
  c.block_table = block_table_.data();
  c.n_blocks = static_cast<int32_t>(block_table_.size());
  c.logits = wanted == LogitsWanted::kAll                    ? LogitsWanted::kAll
             : (wanted == LogitsWanted::kLast && last_chunk) ? LogitsWanted::kLast
                                                             : LogitsWanted::kNone;
  return c;
}

Result<Tensor> SequenceRunner::feed_on_device(std::span<const int32_t> tokens) {
  PAGELLM_RETURN_IF_ERROR(check_tokens(tokens));
  return run_on_device(tokens, 0);
}

Result<Tensor> SequenceRunner::feed_sampled(uint64_t ticket) {
  if (length_ + 1 > max_len_) {
    return out_of_range("sequence of " + std::to_string(length_ + 1) +
                        " tokens exceeds the runner's " + std::to_string(max_len_));
  }
  const int32_t placeholder = -1;  // result row 0 (Backend::take_sampled_tokens)
  return run_on_device(std::span<const int32_t>(&placeholder, 1), ticket);
}

Tensor SequenceRunner::run_on_device(std::span<const int32_t> tokens, uint64_t sampled_ticket) {
  Tensor last;
  for (size_t begin = 0; begin < tokens.size(); begin += max_chunk_) {
    const SeqChunk c = chunk_at(tokens, begin, LogitsWanted::kLast);
    if (graphs_ && graphs_->accepts({c})) {
      last = graphs_->run({c}, sampled_ticket);
    } else {
      model_.forward(builder_.build({c}, sampled_ticket), cache_, nullptr);
      if (c.logits == LogitsWanted::kLast) last = model_.last_logits();
    }
    length_ += c.n_tokens;
  }
  backend_.background_work();  // while the device runs what was just queued
  return last;
}

Result<std::span<const float>> SequenceRunner::feed(std::span<const int32_t> tokens,
                                                    LogitsWanted wanted) {
  if (wanted == LogitsWanted::kLast) {
    auto last = feed_on_device(tokens);
    if (!last.ok()) return last.status();
    logits_.resize(vocab_);
    download_(*last, logits_.data());
    return std::span<const float>(logits_.data(), logits_.size());
  }
  PAGELLM_RETURN_IF_ERROR(check_tokens(tokens));
  logits_.resize(wanted == LogitsWanted::kAll ? tokens.size() * vocab_ : 0);
  int64_t row = 0;
  for (size_t begin = 0; begin < tokens.size(); begin += max_chunk_) {
    const SeqChunk c = chunk_at(tokens, begin, wanted);
    const StepBatch& b = builder_.build({c});
    model_.forward(b, cache_, logits_.data() + row * vocab_);
    row += b.n_logits;
    length_ += c.n_tokens;
  }
  return std::span<const float>(logits_.data(), logits_.size());
}

}  // namespace pagellm
