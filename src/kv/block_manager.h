// BlockManager: the KV cache's bookkeeping as one object: a BlockPool (refcounts, free list in LRU
// order) plus the PrefixCache index. Per-sequence BlockTables (block_table.h) and the scheduler
// allocate, share and release blocks only through it, so eviction of cached content happens in one
// place: allocate() takes the least recently used free block and, if it still held cached
// content, drops that content from the index.
//
// Free-list order: a released block that is in the prefix cache joins the back (most recently
// used, evicted last); one that is not cached joins the front, since its content cannot be found
// again and reusing it first keeps cached content alive longer.
//
// With prefix caching off, nothing is ever registered, lookups find nothing and count nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"

namespace pagellm {

struct KvCacheConfig {
  int32_t n_blocks = 0;
  int32_t block_size = kDefaultBlockSize;
  bool enable_prefix_caching = true;
  // Check all invariants after every operation (O(n_blocks) each): for tests and debug builds.
  bool paranoid = kKvParanoidDefault;
};

// "Copy block src to block dst on the device before this step's forward": emitted when a sequence
// must write into a block that other sequences share (copy-on-write, see block_table.h).
struct BlockCopy {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
  bool operator==(const BlockCopy&) const = default;
};

class BlockManager {
 public:
  explicit BlockManager(const KvCacheConfig& config);
  // A one-line error naming the field for a bad config (n_blocks < 1, block_size < 1, overflow).
  static Status validate(const KvCacheConfig& config);

  int32_t n_blocks() const { return pool_.n_blocks(); }
  int32_t block_size() const { return pool_.block_size(); }
  // Blocks allocate() can hand out now: free ones, cached-but-unused ones included.
  int32_t n_free() const { return pool_.n_free(); }
  int32_t n_used() const { return pool_.n_used(); }
  // Fraction of blocks in use, in [0, 1] (vllm:kv_cache_usage_perc).
  double usage() const { return static_cast<double>(n_used()) / n_blocks(); }
  int32_t ref_count(BlockId b) const { return pool_.ref_count(b); }

  // A block for new content (refcount 1), evicting the LRU cached block if that is what the free
  // list offers; kNoBlock when every block is in use.
  BlockId allocate();
  // One more reference to a block in use (a forked sequence shares it).
  void share(BlockId b);
  // Drops one reference; see the free-list order above.
  void release(BlockId b);

  // --- prefix cache ---
  bool prefix_caching() const { return enable_prefix_caching_; }
  // The longest run of cached blocks matching full blocks start, start + 1, ... of `tokens`, whose
  // chained hashes are `hashes` (hashes.size() full blocks, tokens.size() >= hashes.size() *
  // block_size), appended to *out. Acquires nothing and counts nothing: the caller decides, then
  // acquire()s.
  void match_prefix(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                    uint64_t extra_hash, size_t start, std::vector<BlockId>* out) const;
  // Takes a reference to a cached block found by match_prefix: shares it if in use, else takes it
  // off the free list (a cache hit on freed content).
  void acquire(BlockId b);
  // Adds a lookup to the metrics: `queried` tokens looked up, `hit` of them found.
  void record_lookup(int64_t queried, int64_t hit);
  // Makes full block b (refcount > 0, KV written) findable under its key. False when prefix
  // caching is off or the key is already cached elsewhere (see PrefixCache::insert).
  bool register_block(BlockId b, BlockHash hash, BlockHash parent, uint64_t extra_hash,
                      std::span<const int32_t> tokens);
  bool is_cached(BlockId b) const { return cache_.is_cached(b); }
  const PrefixCacheStats& prefix_stats() const { return cache_.stats(); }

  // The pool's and the index's invariants (see BlockPool, PrefixCache). O(n_blocks).
  Status check_invariants() const;

  const BlockPool& pool() const { return pool_; }
  bool paranoid() const { return pool_.paranoid(); }

 private:
  BlockPool pool_;
  PrefixCache cache_;
  bool enable_prefix_caching_;
};

}  // namespace pagellm
