#include "kv/block_pool.h"

#include <limits>
#include <string>

#include "core/check.h"

namespace pagellm {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, bool paranoid)
    : block_size_(block_size), paranoid_(paranoid) {
  PAGELLM_CHECK(n_blocks >= 1 && block_size >= 1);
  PAGELLM_CHECK_MSG(static_cast<int64_t>(n_blocks) * block_size <=
                        std::numeric_limits<int32_t>::max(),
                    "KV slots must fit in i32");
  ref_.assign(n_blocks, 0);
  prev_.assign(n_blocks, kNoBlock);
  next_.assign(n_blocks, kNoBlock);
  // Initially every block is free, in id order, so a fresh pool hands out 0, 1, 2, ...
  for (BlockId b = 0; b < n_blocks; ++b) link_back(b);
  maybe_check();
}

void BlockPool::check_index(BlockId b) const {
  PAGELLM_CHECK_MSG(b >= 0 && b < n_blocks(), "block id out of range");
}

int32_t BlockPool::ref_count(BlockId b) const {
  check_index(b);
  return ref_[b];
}

void BlockPool::link_back(BlockId b) {
  prev_[b] = tail_;
  next_[b] = kNoBlock;
  if (tail_ != kNoBlock) next_[tail_] = b; else head_ = b;
  tail_ = b;
  ++n_free_;
}

void BlockPool::link_front(BlockId b) {
  prev_[b] = kNoBlock;
  next_[b] = head_;
  if (head_ != kNoBlock) prev_[head_] = b; else tail_ = b;
  head_ = b;
  ++n_free_;
}

void BlockPool::unlink(BlockId b) {
  if (prev_[b] != kNoBlock) next_[prev_[b]] = next_[b]; else head_ = next_[b];
  if (next_[b] != kNoBlock) prev_[next_[b]] = prev_[b]; else tail_ = prev_[b];
  prev_[b] = next_[b] = kNoBlock;
  --n_free_;
}

BlockId BlockPool::allocate() {
  if (head_ == kNoBlock) return kNoBlock;
  BlockId b = head_;
  unlink(b);
  ref_[b] = 1;
  maybe_check();
  return b;
}

void BlockPool::revive(BlockId b) {
  check_index(b);
  PAGELLM_CHECK_MSG(ref_[b] == 0, "revive of a block in use");
  unlink(b);
  ref_[b] = 1;
  maybe_check();
}

void BlockPool::fork(BlockId b) {
  check_index(b);
  PAGELLM_CHECK_MSG(ref_[b] > 0, "fork of a free block");
  ++ref_[b];
  maybe_check();
}

bool BlockPool::free(BlockId b, FreeEnd end) {
  check_index(b);
  PAGELLM_CHECK_MSG(ref_[b] > 0, "double free of a KV block");
  bool now_free = --ref_[b] == 0;
  if (now_free) {
    if (end == FreeEnd::kBack) link_back(b); else link_front(b);
  }
  maybe_check();
  return now_free;
}

std::vector<BlockId> BlockPool::free_list() const {
  std::vector<BlockId> out;
  out.reserve(n_free_);
  for (BlockId b = head_; b != kNoBlock && out.size() <= ref_.size(); b = next_[b]) out.push_back(b);
  return out;
}

Status BlockPool::check_invariants() const {
  const int32_t n = n_blocks();
  std::vector<uint8_t> seen(n, 0);
  int32_t walked = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = head_; b != kNoBlock; b = next_[b]) {
    if (b < 0 || b >= n) return internal_error("block pool: free list holds bad id " + std::to_string(b));
    if (seen[b]) return internal_error("block pool: free list has a cycle at block " + std::to_string(b));
    seen[b] = 1;
    if (prev_[b] != prev) return internal_error("block pool: broken back link at block " + std::to_string(b));
    if (ref_[b] != 0) {
      return internal_error("block pool: free block " + std::to_string(b) + " has refcount " +
                            std::to_string(ref_[b]));
    }
    prev = b;
    ++walked;
  }
  if (prev != tail_) return internal_error("block pool: tail does not end the free list");
  if (walked != n_free_) {
    return internal_error("block pool: free list holds " + std::to_string(walked) +
                          " blocks but n_free is " + std::to_string(n_free_));
  }
  int32_t used = 0;
  for (BlockId b = 0; b < n; ++b) {
    if (ref_[b] < 0) return internal_error("block pool: negative refcount at block " + std::to_string(b));
    if (ref_[b] > 0) {
      ++used;
    } else if (!seen[b]) {
      return internal_error("block pool: block " + std::to_string(b) +
                            " has refcount 0 but is not on the free list");
    }
  }
  if (used + n_free_ != n) {
    return internal_error("block pool: free " + std::to_string(n_free_) + " + used " +
                          std::to_string(used) + " != total " + std::to_string(n));
  }
  return {};
}

void BlockPool::maybe_check() const {
  if (!paranoid_) return;
  Status st = check_invariants();
  PAGELLM_CHECK_MSG(st.ok(), st.message().c_str());
}

}  // namespace pagellm
