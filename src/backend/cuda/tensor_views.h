// The kernels' views (kernels.h) of a Tensor: its rows, its [n, heads, dim] heads, a paged KV
// cache. Shapes are the caller's to check; these only read them.
#pragma once

#include "backend/cuda/kernels.h"
#include "core/check.h"
#include "core/tensor.h"

namespace pagellm::cuda {

inline RowView rows_of(const Tensor& t) {
  return RowView{t.data, t.dtype, t.rows(), t.cols(), t.row_stride()};
}

// A [n, dim] or [n, heads, dim] activation.
inline HeadsView heads_of(const Tensor& t) {
  PAGELLM_CHECK(t.ndim == 2 || t.ndim == 3);
  HeadsView h;
  h.data = t.data;
  h.n = t.size(0);
  h.heads = t.ndim == 3 ? t.size(1) : 1;
  h.dim = t.size(-1);
  h.stride_tok = t.stride[0];
  h.stride_head = t.ndim == 3 ? t.stride[1] : 0;
  return h;
}

inline CacheView cache_of(const Tensor& t) {
  PAGELLM_CHECK_MSG(t.ndim == 4, "KV cache must be [n_blocks, block_size, n_kv_heads, dim]");
  CacheView c;
  c.data = t.data;
  c.n_blocks = t.size(0);
  c.block_size = t.size(1);
  c.heads = t.size(2);
  c.dim = t.size(3);
  c.stride_block = t.stride[0];
  c.stride_tok = t.stride[1];
  c.stride_head = t.stride[2];
  return c;
}

}  // namespace pagellm::cuda
