// KV cache memory layout and sizing. A layout says what one token's cache entry is in each layer:
//   GQA (Llama, Qwen, Mistral, ...): a key [n_kv_heads, head_dim] and a value
//       [n_kv_heads, v_head_dim]; per layer the caches are
//       k_cache [n_blocks, block_size, n_kv_heads, head_dim]
//       v_cache [n_blocks, block_size, n_kv_heads, v_head_dim]
//   MLA (DeepSeek-V2/V3): one latent row of kv_lora_rank + rope_dim (the compressed KV and the
//       shared rotary key), per layer [n_blocks, block_size, kv_lora_rank + rope_dim]; no V cache.
// Sizes are in bytes for a given element size (2 for bf16/f16, 1 for fp8, 4 for f32).
//
// Sizing: the pool gets `--kv-cache-memory` bytes when given; otherwise a fraction of the memory
// left after the weights and the activation peak of a profile run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "kv/block_pool.h"

namespace pagellm {

enum class KvLayoutKind { kGqa, kMla };

struct KvLayout {
  KvLayoutKind kind = KvLayoutKind::kGqa;
  int32_t n_layers = 0;
  int32_t block_size = kDefaultBlockSize;
  // GQA
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t v_head_dim = 0;
  // MLA
  int32_t kv_lora_rank = 0;
  int32_t rope_dim = 0;

  static KvLayout gqa(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                      int32_t block_size = kDefaultBlockSize, int32_t v_head_dim = 0 /* = head_dim */);
  static KvLayout mla(int32_t n_layers, int32_t kv_lora_rank, int32_t rope_dim,
                      int32_t block_size = kDefaultBlockSize);

  // One-line error naming the bad field (all counts must be >= 1).
  Status validate() const;

  // Elements one token occupies in one layer: K and V rows for GQA, the latent row for MLA.
  int64_t elems_per_token_per_layer() const;
  // Bytes of one block over all layers (what one BlockId costs).
  int64_t bytes_per_block(int64_t elem_bytes) const;
  // Bytes of one layer's cache tensor(s) for n_blocks blocks (K plus V for GQA).
  int64_t bytes_per_layer(int64_t n_blocks, int64_t elem_bytes) const;

  // "gqa: 32 layers x (8 kv heads x 128 + 8 x 128) x 16 tokens = 2.00 MiB/block at 2 bytes"
  std::string describe(int64_t elem_bytes) const;
};

// How much memory the KV pool may take.
struct KvBudget {
  std::optional<int64_t> explicit_bytes;  // --kv-cache-memory; wins when set
  double utilization = 0.9;               // fraction of the free memory below, in (0, 1]
};

// Bytes for the KV pool: budget.explicit_bytes, or utilization * free_bytes - activation_bytes,
// where free_bytes is the device's free memory after loading the weights and activation_bytes the
// peak a profile run needed on top. Errors for a utilization outside (0, 1], a negative explicit
// size, or a result below zero.
Result<int64_t> kv_cache_bytes(const KvBudget& budget, int64_t free_bytes,
                               int64_t activation_bytes = 0);

// Blocks that fit in `budget_bytes`, capped so slots fit in i32. An error naming both sizes when
// not even one block fits.
Result<int32_t> n_blocks_for_budget(const KvLayout& layout, int64_t elem_bytes,
                                    int64_t budget_bytes);

// Blocks one sequence of n_tokens needs (ceil(n_tokens / block_size)).
inline int64_t blocks_for_tokens(int64_t n_tokens, int32_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

}  // namespace pagellm
