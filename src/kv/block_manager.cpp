#include "kv/block_manager.h"

#include <limits>
#include <string>

#include "core/check.h"

namespace pagellm {

Status BlockManager::validate(const KvCacheConfig& config) {
  if (config.block_size < 1) {
    return invalid_argument("kv cache: block_size must be >= 1, got " +
                            std::to_string(config.block_size));
  }
  if (config.n_blocks < 1) {
    return invalid_argument("kv cache: n_blocks must be >= 1, got " +
                            std::to_string(config.n_blocks));
  }
  if (static_cast<int64_t>(config.n_blocks) * config.block_size >
      std::numeric_limits<int32_t>::max()) {
    return invalid_argument("kv cache: n_blocks * block_size = " +
                            std::to_string(static_cast<int64_t>(config.n_blocks) *
                                           config.block_size) +
                            " slots do not fit in i32 slot ids");
  }
  return {};
}

BlockManager::BlockManager(const KvCacheConfig& config)
    : pool_(config.n_blocks, config.block_size, config.paranoid),
      cache_(config.n_blocks, config.block_size),
      enable_prefix_caching_(config.enable_prefix_caching) {}

BlockId BlockManager::allocate() {
  BlockId b = pool_.allocate();
  if (b != kNoBlock) cache_.evict(b);  // its old content is about to be overwritten
  return b;
}

void BlockManager::share(BlockId b) { pool_.fork(b); }

void BlockManager::release(BlockId b) {
  pool_.free(b, cache_.is_cached(b) ? BlockPool::FreeEnd::kBack : BlockPool::FreeEnd::kFront);
}

void BlockManager::match_prefix(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                                uint64_t extra_hash, size_t start,
                                std::vector<BlockId>* out) const {
  if (!enable_prefix_caching_) return;
  const int32_t bs = block_size();
  PAGELLM_CHECK(tokens.size() >= hashes.size() * static_cast<size_t>(bs));
  BlockHash parent = start == 0 || start > hashes.size() ? 0 : hashes[start - 1];
  for (size_t i = start; i < hashes.size(); ++i) {
    BlockId b = cache_.find(hashes[i], parent, extra_hash, tokens.subspan(i * bs, bs));
    if (b == kNoBlock) break;
    out->push_back(b);
    parent = hashes[i];
  }
}

void BlockManager::acquire(BlockId b) {
  PAGELLM_CHECK_MSG(cache_.is_cached(b), "acquire of a block that is not in the prefix cache");
  if (pool_.is_free(b)) pool_.revive(b); else pool_.fork(b);
}

void BlockManager::record_lookup(int64_t queried, int64_t hit) {
  if (!enable_prefix_caching_) return;
  cache_.stats().queries += queried;
  cache_.stats().hits += hit;
}

bool BlockManager::register_block(BlockId b, BlockHash hash, BlockHash parent, uint64_t extra_hash,
                                  std::span<const int32_t> tokens) {
  if (!enable_prefix_caching_) return false;
  PAGELLM_CHECK_MSG(!pool_.is_free(b), "registering a free block");
  return cache_.insert(b, hash, parent, extra_hash, tokens);
}

Status BlockManager::check_invariants() const {
  PAGELLM_RETURN_IF_ERROR(pool_.check_invariants());
  PAGELLM_RETURN_IF_ERROR(cache_.check_invariants());
  if (!enable_prefix_caching_ && cache_.size() != 0) {
    return internal_error("block manager: prefix caching is off but blocks are cached");
  }
  return {};
}

}  // namespace pagellm
