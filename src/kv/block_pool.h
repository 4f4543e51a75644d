// BlockPool: the physical KV blocks of the paged cache, as bookkeeping only (no memory). Each block
// has a reference count; blocks with count 0 sit on one free list, which is also the prefix
// cache's LRU order: allocate() takes from the front (least recently freed), release puts a block
// at the back (most recently used) or, when its content is worthless, at the front.
//
// All operations are O(1): the free list is an intrusive doubly linked list over block ids, so a
// free block can also be taken out of the middle (revive: a prefix-cache hit on a freed block).
//
// Invariants (check_invariants(), run after every operation when paranoid checking is on, which is
// the default in builds without NDEBUG):
//   - every refcount >= 0;
//   - a block is on the free list iff its refcount is 0, exactly once;
//   - n_free() + n_used() == n_blocks().
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace pagellm {

using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;
inline constexpr int32_t kDefaultBlockSize = 16;

#ifdef NDEBUG
inline constexpr bool kKvParanoidDefault = false;
#else
inline constexpr bool kKvParanoidDefault = true;
#endif

class BlockPool {
 public:
  // Where a block whose refcount drops to 0 joins the free list.
  enum class FreeEnd {
    kBack,   // most recently used: evicted last (cached content worth keeping)
    kFront,  // reused first (content nobody can find again)
  };

  // n_blocks >= 1, block_size >= 1 and n_blocks * block_size < 2^31 (slots are i32): CHECKed, as
  // sizing (kv_layout.h) validates user input before a pool is built.
  BlockPool(int32_t n_blocks, int32_t block_size = kDefaultBlockSize,
            bool paranoid = kKvParanoidDefault);

  int32_t n_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t n_free() const { return n_free_; }
  int32_t n_used() const { return n_blocks() - n_free_; }
  int32_t ref_count(BlockId b) const;
  bool is_free(BlockId b) const { return ref_count(b) == 0; }

  // Takes the block at the front of the free list (refcount 0 -> 1); kNoBlock when none is free.
  BlockId allocate();
  // Takes a specific free block off the free list (refcount 0 -> 1). Precondition: is_free(b).
  void revive(BlockId b);
  // Shares a block in use (refcount + 1). Precondition: !is_free(b).
  void fork(BlockId b);
  // Drops one reference; at 0 the block joins the free list at `end`. Returns true if it did.
  // Precondition: !is_free(b) (a double free is a programmer error).
  bool free(BlockId b, FreeEnd end = FreeEnd::kBack);

  // The free list front to back (for tests and debugging; O(n_free)).
  std::vector<BlockId> free_list() const;
  // The front of the free list without taking it; kNoBlock when empty.
  BlockId peek_front() const { return head_; }

  // O(n_blocks) full check of the invariants above.
  Status check_invariants() const;
  void set_paranoid(bool on) { paranoid_ = on; }
  bool paranoid() const { return paranoid_; }

 private:
  void check_index(BlockId b) const;
  void link_back(BlockId b);
  void link_front(BlockId b);
  void unlink(BlockId b);
  void maybe_check() const;

  int32_t block_size_;
  bool paranoid_;
  std::vector<int32_t> ref_;   // [n_blocks] reference counts
  std::vector<BlockId> prev_;  // [n_blocks] free-list links; kNoBlock at the ends / when in use
  std::vector<BlockId> next_;  // [n_blocks]
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  int32_t n_free_ = 0;
};

}  // namespace pagellm
