#include "runtime/mtp_proposer.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace pagellm {
namespace {

constexpr int32_t kBlockSize = 16;

}  // namespace

MtpProposer::MtpProposer(MtpModule& mtp, Backend& backend, int32_t max_len, int32_t max_seqs,
                         int32_t max_guesses, const SamplerConfig& sampler)
    : mtp_(mtp),
      module_(mtp.model()),
      backend_(backend),
      max_len_(max_len),
      blocks_per_seq_((max_len + kBlockSize - 1) / kBlockSize),
      stage_rows_(max_guesses + 2),
      row_bytes_(dtype_bytes(backend.activation_dtype(), module_.config().hidden_size)),
      builder_(backend, kBlockSize),
      slots_(max_seqs),
      picker_(backend, sampler) {
  PAGELLM_CHECK(max_len > 0 && max_seqs > 0 && max_guesses > 0);
  cache_ = KvCache::allocate(backend, module_.kv_spec(), kBlockSize,
                             int64_t{max_seqs} * blocks_per_seq_);
  tables_.resize(static_cast<size_t>(max_seqs) * blocks_per_seq_);
  std::iota(tables_.begin(), tables_.end(), 0);
  staging_ = backend.must_allocate(int64_t{max_seqs} * stage_rows_ * row_bytes_,
                                   "the MTP module's staged hidden rows");
}

MtpProposer::~MtpProposer() = default;

char* MtpProposer::staged_row(const Slot& slot, int32_t r) const {
  return static_cast<char*>(staging_->data()) +
         (int64_t{slot.index} * stage_rows_ + r) * row_bytes_;
}

template <class TokenAt>
int32_t MtpProposer::take_staged(const Slot& slot, int32_t known, const TokenAt& token_at,
                                 Part& part) {
  int32_t n = 0;
  for (int32_t r = 0; r < static_cast<int32_t>(slot.staged.size()); ++r, ++n) {
    const int32_t j = slot.frontier() + r;
    // A row whose input was a guess found wrong is not the sequence's: neither are those after.
    if (j + 1 >= known || (slot.staged[r] >= 0 && slot.staged[r] != token_at(j))) break;
    part.tokens.push_back(token_at(j + 1));
    part.rows.push_back(staged_row(slot, r));
  }
  return n;
}

void MtpProposer::unstage(Slot& slot, int32_t n) {
  const int32_t left = static_cast<int32_t>(slot.staged.size()) - n;
  for (int32_t r = 0; n > 0 && r < left; ++r)  // row by row, forwards: no copy overlaps itself
    backend_.copy(staged_row(slot, r), staged_row(slot, r + n), row_bytes_);
  slot.staged.erase(slot.staged.begin(), slot.staged.begin() + n);
}

void MtpProposer::run(std::vector<Part>& parts, LogitsWanted logits) {
  int64_t total = 0;
  for (const Part& p : parts) total += static_cast<int64_t>(p.tokens.size());
  if (total == 0) return;
  if (total > hidden_in_rows_) {
    hidden_in_rows_ = std::max<int64_t>(total, 2 * hidden_in_rows_);
    hidden_in_ =
        backend_.must_allocate(hidden_in_rows_ * row_bytes_, "the MTP module's hidden input");
  }
  // Gather the rows, one copy per run of rows that lie back to back.
  char* dst = static_cast<char*>(hidden_in_->data());
  std::vector<SeqChunk> chunks;
  for (const Part& p : parts) {
    for (size_t i = 0; i < p.rows.size();) {
      size_t k = i + 1;
      while (k < p.rows.size() && p.rows[k] == p.rows[k - 1] + row_bytes_) ++k;
      backend_.copy(dst, p.rows[i], static_cast<int64_t>(k - i) * row_bytes_);
      dst += static_cast<int64_t>(k - i) * row_bytes_;
      i = k;
    }
    SeqChunk c;
    c.tokens = p.tokens.data();
    c.n_tokens = static_cast<int32_t>(p.tokens.size());
    c.start_pos = p.first;
    c.block_table = tables_.data() + static_cast<size_t>(p.slot->index) * blocks_per_seq_;
    c.n_blocks = blocks_per_seq_;
    c.logits = logits;
    chunks.push_back(c);
  }
  const int64_t D = module_.config().hidden_size;
  mtp_.set_hidden_input(
      Tensor(hidden_in_->data(), backend_.activation_dtype(), {total, D}, backend_.device()));
  module_.forward(builder_.build(chunks), cache_, nullptr);
}

void MtpProposer::observe(std::span<const TargetChunk> chunks, const Tensor& hidden) {
  PAGELLM_CHECK_MSG(hidden.defined(), "the target model exports no hidden rows for MTP");
  PAGELLM_CHECK(dtype_bytes(hidden.dtype, hidden.cols()) == row_bytes_);
  const int64_t stride = dtype_bytes(hidden.dtype, hidden.row_stride());
  auto row = [&](int64_t r) { return static_cast<const char*>(hidden.data) + r * stride; };
  // What each chunk leaves for after the forward: staged rows taken, and its own rows to stage.
  struct Leftover {
    Slot* slot;
    int32_t taken, made;  // staged rows taken, entries made in all
    int64_t first_row;    // the hidden rows [first_row, + tokens.size()) to stage
    std::vector<int32_t> tokens;
    int32_t end;  // the chunk's end position
  };
  std::vector<Part> parts;
  std::vector<Leftover> left;
  for (const TargetChunk& c : chunks) {
    Slot* slot = slots_.find(c.request_id, c.seq_index, true);
    if (!slot || c.n_tokens <= 0) continue;
    const int32_t np = static_cast<int32_t>(c.prompt.size());
    const int32_t known = np + static_cast<int32_t>(c.outputs.size());
    auto token_at = [&](int32_t j) { return j < np ? c.prompt[j] : c.outputs[j - np]; };
    const int32_t s = c.start_pos, end = s + c.n_tokens;
    if (s < slot->frontier()) {  // positions the module holds, run again (a recomputed prompt)
      slot->staged.clear();
    } else {
      // Staged rows from s on are this chunk's to replace; a gap before s restarts the slot.
      if (slot->staged.size() > static_cast<size_t>(s - slot->frontier()))
        slot->staged.resize(static_cast<size_t>(s - slot->frontier()));
      if (slot->frontier() + static_cast<int32_t>(slot->staged.size()) < s) {
        slot->base = s;
        slot->done = 0;
        slot->staged.clear();
      }
    }
    Part part{slot, slot->done, {}, {}};
    const int32_t taken = take_staged(*slot, known, token_at, part);
    int32_t j = std::max(s, slot->frontier() + static_cast<int32_t>(slot->staged.size()));
    if (taken == static_cast<int32_t>(slot->staged.size())) {
      for (; j < end && j + 1 < known; ++j) {
        const int32_t t = c.tokens[j - s];
        if (t >= 0 && t != token_at(j)) break;
        part.tokens.push_back(token_at(j + 1));
        part.rows.push_back(row(c.first_row + (j - s)));
      }
    }
    Leftover lo{slot, taken, static_cast<int32_t>(part.tokens.size()), c.first_row + (j - s),
                {},   end};
    for (int32_t k = j; k < end; ++k) lo.tokens.push_back(std::max(c.tokens[k - s], -1));
    left.push_back(std::move(lo));
    if (!part.tokens.empty()) parts.push_back(std::move(part));
  }
  run(parts, LogitsWanted::kNone);
  // The rows read, the slots move on: entries made, the rest staged behind what stays.
  for (Leftover& lo : left) {
    Slot& slot = *lo.slot;
    unstage(slot, lo.taken);
    slot.done += lo.made;
    if (slot.staged.size() + lo.tokens.size() > static_cast<size_t>(stage_rows_)) {
      // More rows waiting for their next tokens than a step leaves: start over after them.
      slot.base = lo.end;
      slot.done = 0;
      slot.staged.clear();
      continue;
    }
    for (size_t k = 0; k < lo.tokens.size(); ++k) {
      backend_.copy(staged_row(slot, static_cast<int32_t>(slot.staged.size())),
                    row(lo.first_row + static_cast<int64_t>(k)), row_bytes_);
      slot.staged.push_back(lo.tokens[k]);
    }
  }
}

void MtpProposer::propose(std::span<const ProposalRequest> batch) {
  struct Work {
    const ProposalRequest* p;
    Slot* slot;
    int32_t taken;
    std::vector<int32_t> history;  // a sampled request's: its outputs, then the guesses so far
    int64_t out_row = 0;           // its last row in the module's last forward
  };
  std::vector<Part> parts;
  std::vector<Work> work;
  for (const ProposalRequest& p : batch) {
    p.draft->clear();
    if (p.draft_probs) p.draft_probs->clear();
    const int32_t len = static_cast<int32_t>(p.tokens.size());
    if (len < 2 || p.max_tokens <= 0) continue;
    PAGELLM_CHECK(!p.params || (p.draft_probs && p.n_prompt <= len));
    Slot* slot = slots_.find(p.request_id, p.seq_index, false);
    // Its entries and guesses reach position len + max_tokens - 3, relative to its base.
    if (!slot || len + p.max_tokens - 2 - slot->base > max_len_) continue;
    Part part{slot, slot->done, {}, {}};
    auto token_at = [&](int32_t j) { return p.tokens[j]; };
    const int32_t taken = take_staged(*slot, len, token_at, part);
    // The first guess comes from the entry at len - 2: without its row, none.
    if (taken == 0 || slot->frontier() + taken != len - 1) continue;
    Work w{&p, slot, taken, {}, 0};
    if (p.params) w.history.assign(p.tokens.begin() + p.n_prompt, p.tokens.end());
    work.push_back(std::move(w));
    parts.push_back(std::move(part));
  }
  if (parts.empty()) return;
  run(parts, LogitsWanted::kLast);
  // The entries are final; what stays staged came after a wrong guess. A chained guess reads the
  // module's output row at its sequence's last entry straight from the forward before: run()
  // gathers the rows before the next forward overwrites them.
  int64_t r = -1;
  for (Work& w : work) {
    r += w.taken;
    w.out_row = r;
    w.slot->done += w.taken;
    w.slot->staged.clear();
  }
  std::vector<int32_t> next;
  for (int32_t depth = 0; !work.empty(); ++depth) {
    draft_rows_.resize(work.size());
    for (size_t i = 0; i < work.size(); ++i) draft_rows_[i] = {work[i].p, &work[i].history};
    picker_.pick(module_.last_logits(), draft_rows_, next);
    // Who guesses again: one entry each, at the guess just made, from the output row before it.
    const Tensor out = module_.last_hidden();
    const int64_t stride = dtype_bytes(out.dtype, out.row_stride());
    std::vector<Work> still;
    parts.clear();
    for (size_t i = 0; i < work.size(); ++i) {
      if (next[i] < 0 || !add_guess(*work[i].p, work[i].history, next[i])) continue;
      parts.push_back({work[i].slot,
                       work[i].slot->done + depth,
                       {next[i]},
                       {static_cast<const char*>(out.data) + work[i].out_row * stride}});
      still.push_back(std::move(work[i]));
      still.back().out_row = static_cast<int64_t>(still.size()) - 1;  // its row in the next forward
    }
    work = std::move(still);
    if (!work.empty()) run(parts, LogitsWanted::kLast);
  }
}

void MtpProposer::release(uint64_t request_id) {
  slots_.release(request_id);
}

}  // namespace pagellm
