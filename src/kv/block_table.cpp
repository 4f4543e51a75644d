#include "kv/block_table.h"

#include <algorithm>

#include "core/check.h"
#include "kv/kv_layout.h"

namespace pagellm {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  PAGELLM_CHECK(block_size >= 1);
}

int32_t BlockTable::slot(int32_t pos) const {
  PAGELLM_CHECK_MSG(pos >= 0 && pos < capacity(), "slot of a position without a block");
  return blocks_[pos / block_size_] * block_size_ + pos % block_size_;
}

int32_t BlockTable::n_blocks_needed(const BlockManager& mgr, int32_t begin, int32_t end) const {
  PAGELLM_CHECK(begin >= 0 && begin <= capacity() && begin < end);
  const int32_t first = begin / block_size_;
  const int32_t last = (end - 1) / block_size_;
  int32_t need = 0;
  for (int32_t i = first; i <= std::min(last, n_blocks() - 1); ++i) {
    if (mgr.ref_count(blocks_[i]) > 1) ++need;  // copy-on-write
  }
  if (last >= n_blocks()) need += last - n_blocks() + 1;
  return need;
}

int32_t BlockTable::max_writable(const BlockManager& mgr, int32_t begin, int32_t max_tokens,
                                 int32_t n_free) const {
  // n_blocks_needed is monotone in the range end: binary search for the largest fitting end.
  int32_t lo = 0, hi = max_tokens;
  while (lo < hi) {
    int32_t mid = lo + (hi - lo + 1) / 2;
    if (n_blocks_needed(mgr, begin, begin + mid) <= n_free) lo = mid; else hi = mid - 1;
  }
  return lo;
}

void BlockTable::prepare_write(BlockManager& mgr, int32_t begin, int32_t end,
                               std::vector<BlockCopy>* copies) {
  PAGELLM_CHECK_MSG(n_blocks_needed(mgr, begin, end) <= mgr.n_free(),
                    "prepare_write without enough free blocks");
  const int32_t first = begin / block_size_;
  const int32_t last = (end - 1) / block_size_;
  for (int32_t i = first; i <= std::min(last, n_blocks() - 1); ++i) {
    BlockId old = blocks_[i];
    if (mgr.ref_count(old) <= 1) continue;
    BlockId fresh = mgr.allocate();
    PAGELLM_CHECK(fresh != kNoBlock);
    copies->push_back({old, fresh});
    blocks_[i] = fresh;
    mgr.release(old);  // still held by the sequences that share it
  }
  while (n_blocks() <= last) {
    BlockId b = mgr.allocate();
    PAGELLM_CHECK(b != kNoBlock);
    blocks_.push_back(b);
  }
}

void BlockTable::compute_hashes(std::span<const int32_t> tokens, int32_t n_full,
                                uint64_t extra_hash) {
  PAGELLM_CHECK(static_cast<int64_t>(n_full) * block_size_ <= static_cast<int64_t>(tokens.size()));
  for (int32_t i = static_cast<int32_t>(hashes_.size()); i < n_full; ++i) {
    BlockHash parent = i == 0 ? 0 : hashes_[i - 1];
    hashes_.push_back(hash_block(parent, extra_hash, tokens.subspan(
                                                         static_cast<size_t>(i) * block_size_,
                                                         block_size_)));
  }
}

void BlockTable::match_cached_prefix(const BlockManager& mgr, std::span<const int32_t> tokens,
                                     uint64_t extra_hash, std::vector<BlockId>* hits) {
  if (!mgr.prefix_caching() || tokens.empty()) return;
  const int32_t n_full = static_cast<int32_t>((tokens.size() - 1) / block_size_);
  if (n_full <= n_blocks()) return;
  compute_hashes(tokens, n_full, extra_hash);
  mgr.match_prefix(std::span<const BlockHash>(hashes_.data(), n_full), tokens, extra_hash,
                   blocks_.size(), hits);
}

int32_t BlockTable::adopt_cached_prefix(BlockManager& mgr, std::span<const BlockId> hits) {
  PAGELLM_CHECK(n_registered_ == n_blocks());
  for (BlockId b : hits) {
    mgr.acquire(b);
    blocks_.push_back(b);
  }
  n_registered_ = n_blocks();
  return capacity();
}

void BlockTable::share_prefix(BlockManager& mgr, const BlockTable& from, int32_t n) {
  PAGELLM_CHECK(empty() && n >= 0 && n <= from.n_blocks() && from.block_size_ == block_size_);
  for (int32_t i = 0; i < n; ++i) {
    mgr.share(from.blocks_[i]);
    blocks_.push_back(from.blocks_[i]);
  }
  // The source registered these (or found them cached, or they duplicate cached content).
  n_registered_ = n;
}

void BlockTable::register_computed(BlockManager& mgr, std::span<const int32_t> tokens,
                                   int32_t n_computed, uint64_t extra_hash) {
  if (!mgr.prefix_caching()) return;
  const int32_t n_full = std::min(n_computed / block_size_, n_blocks());
  if (n_full <= n_registered_) return;
  compute_hashes(tokens, n_full, extra_hash);
  for (int32_t i = n_registered_; i < n_full; ++i) {
    BlockHash parent = i == 0 ? 0 : hashes_[i - 1];
    // A duplicate of content cached elsewhere is not registered and stays an ordinary block.
    mgr.register_block(blocks_[i], hashes_[i], parent, extra_hash,
                       tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
  }
  n_registered_ = n_full;
}

BlockTable BlockTable::fork(BlockManager& mgr) const {
  BlockTable copy = *this;
  for (BlockId b : blocks_) mgr.share(b);
  return copy;
}

void BlockTable::truncate(BlockManager& mgr, int32_t n_tokens) {
  const int32_t keep = static_cast<int32_t>(blocks_for_tokens(n_tokens, block_size_));
  PAGELLM_CHECK_MSG(keep >= n_registered_, "truncate: would drop a registered block");
  while (n_blocks() > keep) {
    mgr.release(blocks_.back());
    blocks_.pop_back();
  }
}

void BlockTable::release(BlockManager& mgr) {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) mgr.release(*it);
  blocks_.clear();
  n_registered_ = 0;
}

}  // namespace pagellm
