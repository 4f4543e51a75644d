#include "runtime/step_batch.h"

#include <algorithm>

namespace pagellm {

StepBatchBuilder::StepBatchBuilder(Backend& backend, int32_t block_size)
    : backend_(backend), block_size_(block_size) {}

const StepBatch& StepBatchBuilder::build(const std::vector<SeqChunk>& seqs,
                                         uint64_t sampled_ticket) {
  return pack(seqs, 0, 0, 0, sampled_ticket);
}

const StepBatch& StepBatchBuilder::build_padded(const std::vector<SeqChunk>& seqs, int32_t n_seqs,
                                                int32_t table_width, int32_t max_context,
                                                uint64_t sampled_ticket) {
  PAGELLM_CHECK(static_cast<int32_t>(seqs.size()) <= n_seqs && table_width >= 1);
  for (const SeqChunk& s : seqs) {
    PAGELLM_CHECK_MSG(s.n_tokens == 1 && s.logits == LogitsWanted::kLast,
                      "a padded batch holds decode steps only");
    PAGELLM_CHECK(s.n_blocks <= table_width && s.start_pos + 1 <= max_context);
  }
  return pack(seqs, n_seqs - static_cast<int32_t>(seqs.size()), table_width, max_context,
              sampled_ticket);
}

const StepBatch& StepBatchBuilder::pack(const std::vector<SeqChunk>& seqs, int32_t n_pad,
                                        int32_t table_width, int32_t max_context,
                                        uint64_t sampled_ticket) {
  const int32_t n_real = static_cast<int32_t>(seqs.size());
  const int32_t n_seqs = n_real + n_pad;
  int32_t n_tokens = n_pad, n_logits = n_pad, max_blocks = std::max(table_width, 1);
  int32_t max_q = n_pad > 0 ? 1 : 0, max_kv = max_context;
  for (const SeqChunk& s : seqs) {
    PAGELLM_CHECK(s.n_tokens > 0);
    PAGELLM_CHECK_MSG(static_cast<int64_t>(s.n_blocks) * block_size_ >= s.start_pos + s.n_tokens,
                      "block table does not cover the chunk");
    n_tokens += s.n_tokens;
    n_logits += s.logits == LogitsWanted::kAll ? s.n_tokens : s.logits == LogitsWanted::kLast;
    max_blocks = std::max(max_blocks, s.n_blocks);
    max_q = std::max(max_q, s.n_tokens);
    max_kv = std::max(max_kv, s.start_pos + s.n_tokens);
  }
  // Staging layout (i32): ids[n] slots[n] cu_seqlens[n_seqs+1] kv_lens[n_seqs]
  //                       block_tables[n_seqs * max_blocks] logits_rows[n_logits]
  const int64_t off_slots = n_tokens, off_cu = off_slots + n_tokens, off_kv = off_cu + n_seqs + 1;
  const int64_t off_bt = off_kv + n_seqs, off_lr = off_bt + int64_t{n_seqs} * max_blocks;
  const int64_t total = off_lr + n_logits;
  staging_.assign(total, 0);
  StepBatch& b = batch_;
  b.positions.resize(n_tokens);
  b.cu_seqlens_q.resize(n_seqs + 1);
  int32_t t = 0, lr = 0;
  staging_[off_cu] = 0;
  for (int32_t s = 0; s < n_real; ++s) {
    const SeqChunk& c = seqs[s];
    for (int32_t i = 0; i < c.n_tokens; ++i, ++t) {
      const int32_t pos = c.start_pos + i;
      staging_[t] = c.tokens[i];
      staging_[off_slots + t] = c.block_table[pos / block_size_] * block_size_ + pos % block_size_;
      b.positions[t] = pos;
      if (c.logits == LogitsWanted::kAll) staging_[off_lr + lr++] = t;
    }
    if (c.logits == LogitsWanted::kLast) staging_[off_lr + lr++] = t - 1;
    staging_[off_cu + s + 1] = t;
    b.cu_seqlens_q[s + 1] = t;
    staging_[off_kv + s] = c.start_pos + c.n_tokens;
    std::copy(c.block_table, c.block_table + c.n_blocks,
              staging_.begin() + off_bt + int64_t{s} * max_blocks);
  }
  for (int32_t s = n_real; s < n_seqs; ++s, ++t) {  // padding: token 0, slot -1, no context
    staging_[off_slots + t] = -1;
    b.positions[t] = 0;
    staging_[off_lr + lr++] = t;
    staging_[off_cu + s + 1] = t + 1;
    b.cu_seqlens_q[s + 1] = t + 1;
  }
  b.cu_seqlens_q[0] = 0;

  const int64_t bytes = total * 4;
  if (!device_ || device_->nbytes() < bytes)
    device_ = backend_.must_allocate(std::max<int64_t>(bytes * 2, 4096), "a step's metadata");
  backend_.copy_from_host(device_->data(), staging_.data(), bytes);
  auto* base = static_cast<int32_t*>(device_->data());
  const Device dev = backend_.device();
  b.n_tokens = n_tokens;
  b.n_logits = n_logits;
  b.token_ids = Tensor(base, DType::kI32, {std::max(n_tokens, 1)}, dev);
  b.slot_mapping = Tensor(base + off_slots, DType::kI32, {std::max(n_tokens, 1)}, dev);
  b.attn.n_seqs = n_seqs;
  b.attn.cu_seqlens_q = Tensor(base + off_cu, DType::kI32, {n_seqs + 1}, dev);
  b.attn.seq_lens_kv = Tensor(base + off_kv, DType::kI32, {std::max(n_seqs, 1)}, dev);
  b.attn.block_tables = Tensor(base + off_bt, DType::kI32, {std::max(n_seqs, 1), max_blocks}, dev);
  b.attn.block_size = block_size_;
  b.attn.max_seqlen_q = max_q;
  b.attn.max_seqlen_kv = max_kv;
  b.attn.total_kv_tokens = 0;
  b.attn.total_qk_pairs = 0;
  for (const SeqChunk& c : seqs) {
    const int64_t n = c.n_tokens, kv = int64_t{c.start_pos} + c.n_tokens;
    b.attn.total_kv_tokens += kv;
    b.attn.total_qk_pairs += n * c.start_pos + n * (n + 1) / 2;  // query i sees start_pos + i + 1 keys
  }
  b.logits_rows = Tensor(base + off_lr, DType::kI32, {std::max(n_logits, 1)}, dev);
  b.logits_every_token = n_logits == n_tokens;
  for (int32_t j = 0; j < n_logits && b.logits_every_token; ++j)
    b.logits_every_token = staging_[off_lr + j] == j;
  if (sampled_ticket != 0) backend_.take_sampled_tokens(b.token_ids, sampled_ticket);
  return b;
}

}  // namespace pagellm
