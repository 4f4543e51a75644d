#include "model/model.h"

namespace pagellm {

int64_t KvCache::bytes_per_block(const KvSpec& spec, int32_t block_size, DType dtype) {
  return spec.n_layers * block_size * spec.token_bytes_per_layer(dtype_bytes(dtype, 1));
}

KvCache KvCache::allocate(Backend& backend, const KvSpec& spec, int32_t block_size,
                          int64_t n_blocks, DType dt) {
  KvCache c;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    auto kb = backend.must_allocate(
        dtype_bytes(dt, n_blocks * block_size * spec.n_kv_heads * spec.k_dim), "the KV cache");
    c.k.push_back(kb->view(dt, {n_blocks, block_size, spec.n_kv_heads, spec.k_dim}));
    c.storage.push_back(std::move(kb));
    if (spec.v_dim > 0) {
      auto vb = backend.must_allocate(
          dtype_bytes(dt, n_blocks * block_size * spec.n_kv_heads * spec.v_dim), "the KV cache");
      c.v.push_back(vb->view(dt, {n_blocks, block_size, spec.n_kv_heads, spec.v_dim}));
      c.storage.push_back(std::move(vb));
    } else {
      c.v.emplace_back();
    }
  }
  return c;
}

}  // namespace pagellm
