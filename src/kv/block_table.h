// BlockTable: one sequence's logical-to-physical block map. Token position p lives in block
// blocks()[p / block_size] at offset p % block_size, i.e. KV slot
//     slot(p) = blocks()[p / block_size] * block_size + p % block_size
// which is what the engine passes to rope_store_kv as the slot mapping; blocks() itself is the
// sequence's row of AttentionMeta::block_tables.
//
// Blocks are taken on demand as positions are written (prepare_write). A block may be shared by
// several sequences (parallel samples forked from one prompt, prefix-cache hits); writing into a
// shared block copies it first (copy-on-write): the table gets a fresh block and a BlockCopy
// {src, dst} that the engine must execute on the device before the step's forward.
//
// The table also carries the chained prefix-cache hashes of its full blocks (computed from the
// sequence's token ids on demand; they depend only on the tokens, so they survive release) and how
// many leading blocks have been registered in the prefix cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_manager.h"

namespace pagellm {

class BlockTable {
 public:
  explicit BlockTable(int32_t block_size = kDefaultBlockSize);

  int32_t block_size() const { return block_size_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  bool empty() const { return blocks_.empty(); }
  // Token positions that have a block: [0, capacity()).
  int32_t capacity() const { return n_blocks() * block_size_; }
  // The KV slot of position pos. Precondition: 0 <= pos < capacity().
  int32_t slot(int32_t pos) const;

  // New blocks prepare_write(begin, end) would take: one per block past the end of the table and
  // one per shared block inside [begin, end). Precondition: begin <= capacity(), begin < end.
  int32_t n_blocks_needed(const BlockManager& mgr, int32_t begin, int32_t end) const;
  // The largest n in [0, max_tokens] with n_blocks_needed(begin, begin + n) <= n_free.
  int32_t max_writable(const BlockManager& mgr, int32_t begin, int32_t max_tokens,
                       int32_t n_free) const;
  // Makes positions [begin, end) writable: copies shared blocks in the range (appending the copy
  // ops to *copies) and appends new blocks. Precondition: n_blocks_needed(...) <= mgr.n_free()
  // (CHECKed; callers size their request first).
  void prepare_write(BlockManager& mgr, int32_t begin, int32_t end, std::vector<BlockCopy>* copies);

  // --- prefix cache ---
  // Extends hashes() to the first n_full full blocks of `tokens` (the sequence's token ids).
  void compute_hashes(std::span<const int32_t> tokens, int32_t n_full, uint64_t extra_hash);
  const std::vector<BlockHash>& hashes() const { return hashes_; }
  // The longest run of cached blocks continuing the table's blocks (all full and computed; none
  // for an empty table) over `tokens`, leaving at least one token to compute (a step must produce
  // the last token's logits): up to block (size - 1) / block_size, so a fully cached prompt
  // recomputes its last block. Appends the hits to *hits without acquiring them.
  void match_cached_prefix(const BlockManager& mgr, std::span<const int32_t> tokens,
                           uint64_t extra_hash, std::vector<BlockId>* hits);
  // Acquires `hits` (from match_cached_prefix) and appends them; returns the tokens the table now
  // holds (the sequence's computed tokens). Precondition: the table's blocks are all full.
  int32_t adopt_cached_prefix(BlockManager& mgr, std::span<const BlockId> hits);
  // Shares the first n blocks of `from` (full, computed blocks of identical tokens: another
  // sample's prompt). Precondition: empty().
  void share_prefix(BlockManager& mgr, const BlockTable& from, int32_t n);
  // Registers every full block whose KV is written (positions < n_computed) and that is not yet
  // registered. Call after the step that computed them.
  void register_computed(BlockManager& mgr, std::span<const int32_t> tokens, int32_t n_computed,
                         uint64_t extra_hash);
  int32_t n_registered() const { return n_registered_; }

  // Drops the blocks past those that positions [0, n_tokens) need, last first: the positions a
  // step wrote speculatively and that turned out not to be the sequence's. Precondition: none
  // of them is registered in the prefix cache.
  void truncate(BlockManager& mgr, int32_t n_tokens);

  // A table sharing every block of this one (each refcount + 1), for a parallel sample.
  BlockTable fork(BlockManager& mgr) const;
  // Drops this table's references, last block first (so a sequence's tail is evicted before its
  // more reusable head), and leaves the table empty. hashes() are kept.
  void release(BlockManager& mgr);

 private:
  int32_t block_size_;
  std::vector<BlockId> blocks_;
  std::vector<BlockHash> hashes_;  // chained hashes of the first hashes_.size() full blocks
  int32_t n_registered_ = 0;       // leading blocks known to the prefix cache (hits or registered)
};

}  // namespace pagellm
