#include "backend/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace pagellm::cpu::ref {

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t d = table.cols();
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    pagellm::to_f32(table.dtype, table.row_ptr(id[i]), row_f32(out, i), d);
}

// As Hugging Face's LlamaRMSNorm in f32: variance = mean(x^2), x * rsqrt(variance + eps), then
// times the weight (in that order).
static void rms_norm_row(const float* x, const float* w, float eps, float* out, int64_t d) {
  double ss = 0.0;
  for (int64_t k = 0; k < d; ++k) ss += static_cast<double>(x[k]) * x[k];
  const float var = static_cast<float>(ss / static_cast<double>(d));
  const float inv = 1.0f / std::sqrt(var + eps);
  for (int64_t k = 0; k < d; ++k) out[k] = (x[k] * inv) * w[k];
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  for (int64_t r = 0; r < x.rows(); ++r)
    rms_norm_row(row_f32(x, r), w.ptr<float>(), eps, row_f32(out, r), x.cols());
}

void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) {
  const int64_t d = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    float* res = row_f32(residual, r);
    const float* xr = row_f32(x, r);
    for (int64_t k = 0; k < d; ++k) res[k] += xr[k];
    rms_norm_row(res, w.ptr<float>(), eps, row_f32(out, r), d);
  }
}

void matmul(const Tensor& x, const Tensor& w, const float* bias, Tensor& out) {
  const int64_t n = x.rows(), k_dim = x.cols(), m_dim = w.size(0);
  std::vector<float> wrow(k_dim);
  for (int64_t m = 0; m < m_dim; ++m) {
    pagellm::to_f32(w.dtype, w.row_ptr(m), wrow.data(), k_dim);
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = row_f32(x, i);
      float s = 0.0f;
      for (int64_t k = 0; k < k_dim; ++k) s += xr[k] * wrow[k];
      if (bias) s += bias[m];
      row_f32(out, i)[m] = s;
    }
  }
}

void rope(Tensor& x, const Tensor& cos_sin, bool interleaved) {
  const int64_t n = x.size(0), heads = x.ndim == 3 ? x.size(1) : 1;
  const int64_t half = cos_sin.cols() / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* cs = cos_sin.ptr<float>() + i * cos_sin.row_stride();
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.ptr<float>() + i * x.stride[0] + (x.ndim == 3 ? h * x.stride[1] : 0);
      for (int64_t j = 0; j < half; ++j) {
        const float c = cs[j], s = cs[half + j];
        const int64_t a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
      }
    }
  }
}

void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
              Tensor& v_cache) {
  const int64_t n = k.size(0), hkv = k.size(1), d = k.size(2), dv = v.size(2);
  const int64_t bs = k_cache.size(1);
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;  // padding: not stored
    const int64_t block = slots[i] / bs, off = slots[i] % bs;
    for (int64_t h = 0; h < hkv; ++h) {
      std::memcpy(k_cache.ptr<float>() + block * k_cache.stride[0] + off * k_cache.stride[1] +
                      h * k_cache.stride[2],
                  k.ptr<float>() + i * k.stride[0] + h * k.stride[1], d * sizeof(float));
      std::memcpy(v_cache.ptr<float>() + block * v_cache.stride[0] + off * v_cache.stride[1] +
                      h * v_cache.stride[2],
                  v.ptr<float>() + i * v.stride[0] + h * v.stride[1], dv * sizeof(float));
    }
  }
}

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const AttentionMeta& meta, const AttentionParams& params, Tensor& out) {
  const int64_t hq = q.size(1), d = q.size(2), hkv = k_cache.size(2), dv = v_cache.size(3);
  const int64_t group = hq / hkv;
  const int32_t bs = meta.block_size;
  const int32_t* cu = meta.cu_seqlens_q.ptr<int32_t>();
  const int32_t* lens = meta.seq_lens_kv.ptr<int32_t>();
  const int64_t table_stride = meta.block_tables.row_stride();
  std::vector<float> scores;
  std::vector<double> acc(dv);
  for (int32_t s = 0; s < meta.n_seqs; ++s) {
    const int32_t* table = meta.block_tables.ptr<int32_t>() + s * table_stride;
    const int32_t n_q = cu[s + 1] - cu[s];
    for (int32_t i = 0; i < n_q; ++i) {
      const int64_t tok = cu[s] + i;
      const int32_t pos = lens[s] - n_q + i;
      const int32_t lo = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      for (int64_t h = 0; h < hq; ++h) {
        if (lens[s] == 0) {  // a padding sequence of a graph batch: no keys, zeros
          std::fill_n(out.ptr<float>() + tok * out.stride[0] + h * out.stride[1], dv, 0.0f);
          continue;
        }
        const int64_t kh = h / group;
        const float* qv = q.ptr<float>() + tok * q.stride[0] + h * q.stride[1];
        auto k_at = [&](int32_t p) {
          return k_cache.ptr<float>() + table[p / bs] * k_cache.stride[0] +
                 (p % bs) * k_cache.stride[1] + kh * k_cache.stride[2];
        };
        auto v_at = [&](int32_t p) {
          return v_cache.ptr<float>() + table[p / bs] * v_cache.stride[0] +
                 (p % bs) * v_cache.stride[1] + kh * v_cache.stride[2];
        };
        attention_row(qv, d, dv, lo, pos, params, k_at, v_at, scores, acc,
                      out.ptr<float>() + tok * out.stride[0] + h * out.stride[1]);
      }
    }
  }
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t d = gate.cols();
  for (int64_t r = 0; r < gate.rows(); ++r) {
    const float* g = row_f32(gate, r);
    const float* u = row_f32(up, r);
    float* o = row_f32(out, r);
    for (int64_t k = 0; k < d; ++k) o[k] = g[k] / (1.0f + std::exp(-g[k])) * u[k];
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t d = a.cols();
  for (int64_t r = 0; r < a.rows(); ++r) {
    const float* x = row_f32(a, r);
    const float* y = row_f32(b, r);
    float* o = row_f32(out, r);
    for (int64_t k = 0; k < d; ++k) o[k] = x[k] + y[k];
  }
}

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int32_t* idx = rows.ptr<int32_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    std::memmove(row_f32(out, i), row_f32(x, idx[i]), x.cols() * sizeof(float));
}

void to_f32(const Tensor& x, Tensor& out) {
  for (int64_t r = 0; r < x.rows(); ++r)
    std::memmove(row_f32(out, r), row_f32(x, r), x.cols() * sizeof(float));
}

}  // namespace pagellm::cpu::ref
