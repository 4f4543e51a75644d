#include "runtime/draft_model_proposer.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace pagellm {
namespace {

constexpr int32_t kBlockSize = 16;
// A sequence with more new tokens than this (its prompt, the first time; its whole text, after
// the engine preempted it) feeds the rest alone first, in chunks of kMaxChunk, so that the
// batched forwards stay small.
constexpr int32_t kMaxBatchedTokens = 16;
constexpr int32_t kMaxChunk = 512;

}  // namespace

DraftModelProposer::DraftModelProposer(Model& draft, Backend& backend, int32_t max_len,
                                       int32_t max_seqs, const SamplerConfig& sampler, bool graphs)
    : draft_(draft),
      backend_(backend),
      max_len_(max_len),
      blocks_per_seq_((max_len + kBlockSize - 1) / kBlockSize),
      builder_(backend, kBlockSize),
      slots_(max_seqs),
      picker_(backend, sampler) {
  PAGELLM_CHECK(max_len > 0 && max_seqs > 0);
  cache_ =
      KvCache::allocate(backend, draft.kv_spec(), kBlockSize, int64_t{max_seqs} * blocks_per_seq_);
  tables_.resize(static_cast<size_t>(max_seqs) * blocks_per_seq_);
  std::iota(tables_.begin(), tables_.end(), 0);
  // Slots' block tables are max_len wide, as the graphs' padded batches lay them out.
  if (graphs) {
    graphs_ = DecodeGraphs::create(draft_, backend_, cache_, kBlockSize, max_seqs, max_len);
    if (graphs_) graphs_->warm_up();
  }
}

DraftModelProposer::~DraftModelProposer() = default;

SeqChunk DraftModelProposer::chunk(Slot& slot, const int32_t* tokens, int32_t n,
                                   LogitsWanted logits) {
  SeqChunk c;
  c.tokens = tokens;
  c.n_tokens = n;
  c.start_pos = static_cast<int32_t>(slot.fed.size());
  c.block_table = tables_.data() + static_cast<size_t>(slot.index) * blocks_per_seq_;
  c.n_blocks = blocks_per_seq_;
  c.logits = logits;
  slot.fed.insert(slot.fed.end(), tokens, tokens + n);
  return c;
}

void DraftModelProposer::step(const std::vector<SeqChunk>& chunks, std::vector<Work>& work,
                              std::vector<int32_t>& next) {
  const int32_t n = static_cast<int32_t>(chunks.size());
  next.assign(chunks.size(), -1);
  Tensor logits;  // act [n, vocab] on the backend's device
  if (graphs_ && graphs_->accepts(chunks)) {
    logits = graphs_->run(chunks);
  } else {
    const StepBatch& batch = builder_.build(chunks);
    draft_.forward(batch, cache_, nullptr);
    if (batch.n_logits == 0) return;  // a catch-up: KV only
    PAGELLM_CHECK(batch.n_logits == n);
    logits = draft_.last_logits();
  }
  PAGELLM_CHECK(work.size() == chunks.size());
  rows_.resize(work.size());
  for (size_t i = 0; i < work.size(); ++i) rows_[i] = {work[i].p, &work[i].history};
  picker_.pick(logits, rows_, next);
}

void DraftModelProposer::propose(std::span<const ProposalRequest> batch) {
  std::vector<Work> work;
  std::vector<SeqChunk> chunks;
  std::vector<int32_t> next;
  std::vector<Work> none;
  for (const ProposalRequest& p : batch) {
    p.draft->clear();
    if (p.draft_probs) p.draft_probs->clear();
    const int64_t len = static_cast<int64_t>(p.tokens.size());
    if (len == 0 || p.max_tokens <= 0 || len + p.max_tokens > max_len_) continue;
    PAGELLM_CHECK(!p.params || (p.draft_probs && p.n_prompt <= len));
    Slot* found = slots_.find(p.request_id, p.seq_index, true);
    if (!found) continue;
    Slot& slot = *found;
    // What the slot holds that is still the sequence's (its wrong guesses go), less the last
    // token at least: the guesses start from that token's logits.
    const int64_t same =
        std::mismatch(slot.fed.begin(), slot.fed.end(), p.tokens.begin(), p.tokens.end()).first -
        slot.fed.begin();
    int64_t keep = std::min(same, len - 1);
    slot.fed.resize(static_cast<size_t>(keep));
    while (len - keep > kMaxBatchedTokens) {  // a long catch-up runs alone, without logits
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(kMaxChunk, len - keep - 1));
      step({chunk(slot, p.tokens.data() + keep, n, LogitsWanted::kNone)}, none, next);
      keep += n;
    }
    Work w{&p, &slot, {}};
    if (p.params) w.history.assign(p.tokens.begin() + p.n_prompt, p.tokens.end());
    work.push_back(std::move(w));
    chunks.push_back(
        chunk(slot, p.tokens.data() + keep, static_cast<int32_t>(len - keep), LogitsWanted::kLast));
  }
  // Guess after guess, every sequence that still wants one in each forward.
  while (!chunks.empty()) {
    step(chunks, work, next);
    std::vector<Work> still;
    chunks.clear();
    for (size_t i = 0; i < work.size(); ++i) {
      if (next[i] < 0 || !add_guess(*work[i].p, work[i].history, next[i])) continue;
      still.push_back(std::move(work[i]));
      chunks.push_back(
          chunk(*still.back().slot, &still.back().p->draft->back(), 1, LogitsWanted::kLast));
    }
    work = std::move(still);
  }
}

void DraftModelProposer::release(uint64_t request_id) {
  slots_.release(request_id);
}

}  // namespace pagellm
