#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"

namespace pagellm {

uint64_t hash_extra_keys(std::span<const uint64_t> extra_keys) {
  if (extra_keys.empty()) return 0;
  return XXH3_64bits(extra_keys.data(), extra_keys.size_bytes());
}

BlockHash hash_block(BlockHash parent, uint64_t extra_hash, std::span<const int32_t> tokens) {
  // One contiguous buffer keeps this a single one-shot XXH3 call (the streaming state is only
  // stack-allocatable with the library's unstable static-linking API). Token ids are hashed as
  // their i32 bytes in host order, which is little-endian on every target we build for.
  constexpr size_t kHeader = 2 * sizeof(uint64_t);
  constexpr size_t kStackTokens = 256;
  unsigned char stack_buf[kHeader + kStackTokens * sizeof(int32_t)];
  std::vector<unsigned char> heap_buf;
  unsigned char* buf = stack_buf;
  const size_t n_bytes = kHeader + tokens.size_bytes();
  if (tokens.size() > kStackTokens) {
    heap_buf.resize(n_bytes);
    buf = heap_buf.data();
  }
  std::memcpy(buf, &parent, sizeof parent);
  std::memcpy(buf + sizeof parent, &extra_hash, sizeof extra_hash);
  if (!tokens.empty()) std::memcpy(buf + kHeader, tokens.data(), tokens.size_bytes());
  return XXH3_64bits(buf, n_bytes);
}

PrefixCache::PrefixCache(int32_t n_blocks, int32_t block_size)
    : block_size_(block_size),
      cached_(n_blocks, 0),
      hash_(n_blocks, 0),
      parent_(n_blocks, 0),
      extra_(n_blocks, 0),
      tokens_(static_cast<size_t>(n_blocks) * block_size, 0) {
  map_.reserve(n_blocks);
}

BlockId PrefixCache::find(BlockHash hash, BlockHash parent, uint64_t extra_hash,
                          std::span<const int32_t> tokens) const {
  auto it = map_.find(hash);
  if (it == map_.end()) return kNoBlock;
  BlockId b = it->second;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * block_size_;
  if (parent_[b] != parent || extra_[b] != extra_hash ||
      !std::equal(tokens.begin(), tokens.end(), stored)) {
    return kNoBlock;  // a hash collision: different content under the same 64-bit hash
  }
  return b;
}

bool PrefixCache::insert(BlockId b, BlockHash hash, BlockHash parent, uint64_t extra_hash,
                         std::span<const int32_t> tokens) {
  PAGELLM_CHECK(b >= 0 && b < static_cast<BlockId>(cached_.size()));
  PAGELLM_CHECK(static_cast<int32_t>(tokens.size()) == block_size_);
  if (cached_[b]) return false;
  auto [it, inserted] = map_.emplace(hash, b);
  if (!inserted) return false;
  cached_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent;
  extra_[b] = extra_hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
  return true;
}

bool PrefixCache::evict(BlockId b) {
  if (!cached_[b]) return false;
  auto it = map_.find(hash_[b]);
  PAGELLM_CHECK(it != map_.end() && it->second == b);
  map_.erase(it);
  cached_[b] = 0;
  ++stats_.evictions;
  return true;
}

Status PrefixCache::check_invariants() const {
  int64_t n_cached = 0;
  for (size_t b = 0; b < cached_.size(); ++b) {
    if (!cached_[b]) continue;
    ++n_cached;
    auto it = map_.find(hash_[b]);
    if (it == map_.end() || it->second != static_cast<BlockId>(b)) {
      return internal_error("prefix cache: cached block " + std::to_string(b) +
                            " is not indexed under its hash");
    }
  }
  if (n_cached != static_cast<int64_t>(map_.size())) {
    return internal_error("prefix cache: index has " + std::to_string(map_.size()) +
                          " entries but " + std::to_string(n_cached) + " blocks are cached");
  }
  return {};
}

}  // namespace pagellm
