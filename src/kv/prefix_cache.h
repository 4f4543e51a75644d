// Prefix caching: an index from the hash of a full KV block's content to the physical block that
// holds it, so a new prompt that starts with already computed tokens reuses their KV.
//
// A full block's hash chains its parent's hash (the block before it in the sequence; 0 for the
// first block), the request's extra keys (LoRA adapter id, multimodal content hash, cache salt: any
// input besides token ids that changes the KV) and its block_size token ids:
//     hash_i = XXH3_64(parent = hash_{i-1}, extra_hash, tokens[i*bs, (i+1)*bs))
// so equal hashes mean equal whole prefixes. The index also keeps each cached block's key (parent
// hash, extra hash, tokens) and compares it on lookup, so a 64-bit hash collision is a miss rather
// than wrong KV.
//
// The index does not own blocks: BlockManager (block_manager.h) combines it with a BlockPool, whose
// free list gives the LRU order in which cached blocks of refcount 0 are evicted.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"

namespace pagellm {

using BlockHash = uint64_t;

// The hash of a request's extra keys, folded into every block hash; 0 when there are none.
uint64_t hash_extra_keys(std::span<const uint64_t> extra_keys);
// The chained hash of one full block (tokens.size() == block size).
BlockHash hash_block(BlockHash parent, uint64_t extra_hash, std::span<const int32_t> tokens);

// Counters in the meaning of vLLM's prefix-cache metrics (tokens, not blocks).
struct PrefixCacheStats {
  int64_t queries = 0;    // prompt tokens looked up (vllm:prefix_cache_queries)
  int64_t hits = 0;       // of those, tokens found cached (vllm:prefix_cache_hits)
  int64_t evictions = 0;  // cached blocks whose content was dropped to reuse the block
  double hit_rate() const { return queries > 0 ? static_cast<double>(hits) / queries : 0.0; }
};

class PrefixCache {
 public:
  PrefixCache(int32_t n_blocks, int32_t block_size);

  // The cached block whose key is exactly (hash, parent, extra_hash, tokens), or kNoBlock.
  BlockId find(BlockHash hash, BlockHash parent, uint64_t extra_hash,
               std::span<const int32_t> tokens) const;
  // Makes block b findable under its key. Returns false (and changes nothing) when b is already
  // cached or another block already holds this hash: the first copy wins and the duplicate stays
  // an ordinary block (it is freed to the front of the free list like any uncached block).
  bool insert(BlockId b, BlockHash hash, BlockHash parent, uint64_t extra_hash,
              std::span<const int32_t> tokens);
  // Drops b from the index if it is cached (its content is about to be overwritten). Returns
  // whether it was.
  bool evict(BlockId b);

  bool is_cached(BlockId b) const { return cached_[b] != 0; }
  BlockHash hash_of(BlockId b) const { return hash_[b]; }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }

  PrefixCacheStats& stats() { return stats_; }
  const PrefixCacheStats& stats() const { return stats_; }

  // Every index entry points at a block that is cached under that hash, and vice versa.
  Status check_invariants() const;

 private:
  int32_t block_size_;
  std::unordered_map<BlockHash, BlockId> map_;
  // Per block: whether it is in the index, and its key.
  std::vector<uint8_t> cached_;   // [n_blocks]
  std::vector<BlockHash> hash_;   // [n_blocks]
  std::vector<BlockHash> parent_; // [n_blocks]
  std::vector<uint64_t> extra_;   // [n_blocks]
  std::vector<int32_t> tokens_;   // [n_blocks, block_size]
  PrefixCacheStats stats_;
};

}  // namespace pagellm
