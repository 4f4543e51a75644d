// The host side of a paged attention test batch: sequences with their queries and cached
// lengths, optional graph-batch padding, and block tables into a shuffled pool of cache blocks.
// Shared by the dense and latent attention op tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <utility>
#include <vector>

#include "op_test_util.h"

namespace pagellm::optest {

struct Seq {
  int32_t n_q;     // queries in this step (the last n_q of the sequence's tokens)
  int32_t kv_len;  // tokens in the cache, the new ones included
};

inline std::vector<Seq> decode_seqs(std::initializer_list<int32_t> kv_lens) {
  std::vector<Seq> s;
  for (int32_t l : kv_lens) s.push_back({1, l});
  return s;
}

struct PagedBatch {
  int32_t n_real = 0, n_seqs = 0;  // the case's sequences, then padding ones (1 query, no context)
  int32_t max_q = 0, max_kv = 0;
  int64_t n = 0, n_real_tokens = 0;  // query tokens, all and of the real sequences
  std::vector<int32_t> cu, lens;     // cu_seqlens_q [n_seqs + 1], seq_lens_kv [n_seqs]
  int64_t pool = 0;                  // cache blocks
  int64_t table_ld = 0;
  std::vector<int32_t> table;  // [n_seqs][table_ld], -1 past a sequence's blocks
};

// A pool with spare blocks, handed out in shuffled order (from rng) so no sequence's blocks are
// consecutive; table rows padded past the longest sequence's blocks.
inline PagedBatch paged_batch(Rng& rng, const std::vector<Seq>& seqs, int32_t n_padding,
                              int32_t bs) {
  PagedBatch b;
  b.n_real = static_cast<int32_t>(seqs.size());
  b.n_seqs = b.n_real + n_padding;
  b.cu.assign(b.n_seqs + 1, 0);
  b.lens.assign(b.n_seqs, 0);
  int32_t max_blocks = 1;
  int64_t total_blocks = 0;
  for (int32_t s = 0; s < b.n_seqs; ++s) {
    const Seq sq = s < b.n_real ? seqs[s] : Seq{1, 0};
    b.cu[s + 1] = b.cu[s] + sq.n_q;
    b.lens[s] = sq.kv_len;
    b.max_q = std::max(b.max_q, sq.n_q);
    b.max_kv = std::max(b.max_kv, sq.kv_len);
    const int32_t nb = (sq.kv_len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  b.n = b.cu[b.n_seqs];
  b.n_real_tokens = b.cu[b.n_real];
  b.pool = total_blocks + 5;
  std::vector<int32_t> perm(b.pool);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = b.pool - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  b.table_ld = max_blocks + 3;
  b.table.assign(b.n_seqs * b.table_ld, -1);
  int64_t next = 0;
  for (int32_t s = 0; s < b.n_seqs; ++s)
    for (int32_t k = 0; k < (b.lens[s] + bs - 1) / bs; ++k)
      b.table[s * b.table_ld + k] = perm[next++];
  return b;
}

// `meta` (the device batch) over the real sequences only, with b's host arrays: the CPU
// reference's metadata (it rejects a query without context).
inline AttentionMeta real_host_meta(PagedBatch& b, const AttentionMeta& meta) {
  AttentionMeta h = meta;
  h.n_seqs = b.n_real;
  h.cu_seqlens_q = Tensor(b.cu.data(), DType::kI32, {b.n_real + 1});
  h.seq_lens_kv = Tensor(b.lens.data(), DType::kI32, {b.n_real});
  h.block_tables = Tensor(b.table.data(), DType::kI32, {b.n_real, b.table_ld});
  return h;
}

}  // namespace pagellm::optest
