#include "kv/kv_layout.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace pagellm {

KvLayout KvLayout::gqa(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                       int32_t v_head_dim) {
  KvLayout l;
  l.kind = KvLayoutKind::kGqa;
  l.n_layers = n_layers;
  l.block_size = block_size;
  l.n_kv_heads = n_kv_heads;
  l.head_dim = head_dim;
  l.v_head_dim = v_head_dim > 0 ? v_head_dim : head_dim;
  return l;
}

KvLayout KvLayout::mla(int32_t n_layers, int32_t kv_lora_rank, int32_t rope_dim,
                       int32_t block_size) {
  KvLayout l;
  l.kind = KvLayoutKind::kMla;
  l.n_layers = n_layers;
  l.block_size = block_size;
  l.kv_lora_rank = kv_lora_rank;
  l.rope_dim = rope_dim;
  return l;
}

namespace {
Status need_positive(const char* field, int32_t v) {
  if (v >= 1) return {};
  return invalid_argument(std::string("kv layout: ") + field + " must be >= 1, got " +
                          std::to_string(v));
}
}  // namespace

Status KvLayout::validate() const {
  PAGELLM_RETURN_IF_ERROR(need_positive("n_layers", n_layers));
  PAGELLM_RETURN_IF_ERROR(need_positive("block_size", block_size));
  if (kind == KvLayoutKind::kGqa) {
    PAGELLM_RETURN_IF_ERROR(need_positive("n_kv_heads", n_kv_heads));
    PAGELLM_RETURN_IF_ERROR(need_positive("head_dim", head_dim));
    PAGELLM_RETURN_IF_ERROR(need_positive("v_head_dim", v_head_dim));
  } else {
    PAGELLM_RETURN_IF_ERROR(need_positive("kv_lora_rank", kv_lora_rank));
    // rope_dim may be 0 in principle (no decoupled rotary key), but every MLA model has one.
    PAGELLM_RETURN_IF_ERROR(need_positive("rope_dim", rope_dim));
  }
  return {};
}

int64_t KvLayout::elems_per_token_per_layer() const {
  if (kind == KvLayoutKind::kGqa) {
    return static_cast<int64_t>(n_kv_heads) * head_dim + static_cast<int64_t>(n_kv_heads) * v_head_dim;
  }
  return static_cast<int64_t>(kv_lora_rank) + rope_dim;
}

int64_t KvLayout::bytes_per_block(int64_t elem_bytes) const {
  return elems_per_token_per_layer() * block_size * n_layers * elem_bytes;
}

int64_t KvLayout::bytes_per_layer(int64_t n_blocks, int64_t elem_bytes) const {
  return elems_per_token_per_layer() * block_size * n_blocks * elem_bytes;
}

std::string KvLayout::describe(int64_t elem_bytes) const {
  char buf[256];
  const double mib = static_cast<double>(bytes_per_block(elem_bytes)) / (1024.0 * 1024.0);
  if (kind == KvLayoutKind::kGqa) {
    std::snprintf(buf, sizeof buf,
                  "gqa: %d layers x (%d kv heads x %d + %d x %d) x %d tokens = %.3f MiB/block at "
                  "%lld bytes",
                  n_layers, n_kv_heads, head_dim, n_kv_heads, v_head_dim, block_size, mib,
                  static_cast<long long>(elem_bytes));
  } else {
    std::snprintf(buf, sizeof buf,
                  "mla: %d layers x (%d latent + %d rope) x %d tokens = %.3f MiB/block at %lld "
                  "bytes",
                  n_layers, kv_lora_rank, rope_dim, block_size, mib,
                  static_cast<long long>(elem_bytes));
  }
  return buf;
}

Result<int64_t> kv_cache_bytes(const KvBudget& budget, int64_t free_bytes,
                               int64_t activation_bytes) {
  if (budget.explicit_bytes) {
    if (*budget.explicit_bytes <= 0) {
      return invalid_argument("--kv-cache-memory must be > 0 bytes, got " +
                              std::to_string(*budget.explicit_bytes));
    }
    return *budget.explicit_bytes;
  }
  if (!(budget.utilization > 0.0 && budget.utilization <= 1.0)) {
    return invalid_argument("KV memory utilization must be in (0, 1], got " +
                            std::to_string(budget.utilization));
  }
  const int64_t usable = static_cast<int64_t>(static_cast<double>(free_bytes) * budget.utilization);
  const int64_t bytes = usable - activation_bytes;
  if (bytes <= 0) {
    return resource_exhausted("no memory left for the KV cache: " + std::to_string(free_bytes) +
                              " bytes free after weights x utilization " +
                              std::to_string(budget.utilization) + " leaves " +
                              std::to_string(usable) + ", and activations need " +
                              std::to_string(activation_bytes));
  }
  return bytes;
}

Result<int32_t> n_blocks_for_budget(const KvLayout& layout, int64_t elem_bytes,
                                    int64_t budget_bytes) {
  PAGELLM_RETURN_IF_ERROR(layout.validate());
  if (elem_bytes < 1) {
    return invalid_argument("kv layout: element size must be >= 1 byte, got " +
                            std::to_string(elem_bytes));
  }
  const int64_t per_block = layout.bytes_per_block(elem_bytes);
  const int64_t n = budget_bytes / per_block;
  if (n < 1) {
    return resource_exhausted("KV cache budget of " + std::to_string(budget_bytes) +
                              " bytes is smaller than one block (" + layout.describe(elem_bytes) +
                              ")");
  }
  // Slots (block * block_size + offset) are i32 in the attention metadata.
  const int64_t max_blocks = std::numeric_limits<int32_t>::max() / layout.block_size;
  return static_cast<int32_t>(std::min(n, max_blocks));
}

}  // namespace pagellm
