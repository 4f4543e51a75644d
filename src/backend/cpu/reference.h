// The CPU reference ops: plain loops with f32 accumulation (double for norm and softmax sums),
// written to be obviously correct. make_cpu_backend(false) runs these; the fast paths are tested
// against them. Preconditions (shapes, dtypes) are checked by the backend before the call.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/tensor.h"

namespace pagellm::cpu {

// Element offset of row r of `t` viewed as [rows, cols], for any strides of the leading dims.
inline int64_t row_offset(const Tensor& t, int64_t r) {
  int64_t off = 0;
  for (int i = t.ndim - 2; i >= 0; --i) {
    const int64_t idx = r % t.shape[i];
    r /= t.shape[i];
    off += idx * t.stride[i];
  }
  return off;
}
inline float* row_f32(const Tensor& t, int64_t r) { return t.ptr<float>() + row_offset(t, r); }

namespace ref {

void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out);
void matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor& out);
void rope(Tensor& x, const Tensor& cos_sin, bool interleaved);
void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
              Tensor& v_cache);
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const AttentionMeta& meta, const AttentionParams& params, Tensor& out);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out);
void to_f32(const Tensor& x, Tensor& out);

}  // namespace ref
}  // namespace pagellm::cpu
