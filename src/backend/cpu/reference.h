// The CPU reference ops: plain loops with f32 accumulation (double for norm and softmax sums),
// written to be obviously correct. make_cpu_backend(false) runs these; the fast paths are tested
// against them. Preconditions (shapes, dtypes) are checked by the backend before the call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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

// One query row of attention(): q [d] against keys key(p) for positions [lo, pos] (scaled,
// soft-capped scores, softmax in double), the values value(p) weighted into o [dv]. key(p) and
// value(p) give a row whose [c] is element c as f32: a cache row's pointer, or an FP8 cache's
// decoding view. scores and acc are scratch.
template <typename KeyRow, typename ValueRow>
void attention_row(const float* q, int64_t d, int64_t dv, int32_t lo, int32_t pos,
                   const AttentionParams& params, KeyRow key, ValueRow value,
                   std::vector<float>& scores, std::vector<double>& acc, float* o) {
  scores.assign(static_cast<size_t>(pos - lo + 1), 0.0f);
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t p = lo; p <= pos; ++p) {
    const auto kv = key(p);
    float dot = 0.0f;
    for (int64_t e = 0; e < d; ++e) dot += q[e] * kv[e];
    float sc = dot * params.scale;
    if (params.softcap > 0.0f) sc = params.softcap * std::tanh(sc / params.softcap);
    scores[p - lo] = sc;
    mx = std::max(mx, sc);
  }
  double sum = 0.0;
  acc.assign(static_cast<size_t>(dv), 0.0);
  for (int32_t p = lo; p <= pos; ++p) {
    const double e = std::exp(static_cast<double>(scores[p - lo] - mx));
    sum += e;
    const auto vv = value(p);
    for (int64_t c = 0; c < dv; ++c) acc[c] += e * vv[c];
  }
  for (int64_t c = 0; c < dv; ++c) o[c] = static_cast<float>(acc[c] / sum);
}
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out);
void to_f32(const Tensor& x, Tensor& out);

}  // namespace ref
}  // namespace pagellm::cpu
