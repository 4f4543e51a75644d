#include "backend/cpu/fp8_kv.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/reference.h"
#include "core/thread_pool.h"

namespace pagellm::cpu {
namespace {

// Every e4m3 code's value.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// A cache row of e4m3 codes read as f32: [c] = scale * e4m3(code c).
struct Decoded {
  const uint8_t* codes;
  float scale;
  const std::array<float, 256>& table;
  float operator[](int64_t c) const { return scale * table[codes[c]]; }
};

}  // namespace

void store_kv_fp8(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, float k_scale,
                  float v_scale, Tensor& k_cache, Tensor& v_cache) {
  const int64_t n = k.size(0), hkv = k.size(1), d = k.size(2), dv = v.size(2);
  const int64_t bs = k_cache.size(1);
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  const float k_inv = 1.0f / k_scale, v_inv = 1.0f / v_scale;
  auto store = [](const float* x, int64_t len, float inv, uint8_t* dst) {
    for (int64_t e = 0; e < len; ++e) dst[e] = f32_to_e4m3(x[e] * inv);
  };
  // MLA's V is a column view of K's rows: K is written last, so the bytes hold K's codes (the
  // same values, the same scale).
  // Tokens spread over the pool: a prompt's are many (distinct slots, so no two write a byte).
  ThreadPool::global().parallel_for(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (slots[i] < 0) continue;  // padding: not stored
      const int64_t block = slots[i] / bs, off = slots[i] % bs;
      for (int64_t h = 0; h < hkv; ++h) {
        store(v.ptr<float>() + i * v.stride[0] + h * v.stride[1], dv, v_inv,
              v_cache.ptr<uint8_t>() + block * v_cache.stride[0] + off * v_cache.stride[1] +
                  h * v_cache.stride[2]);
        store(k.ptr<float>() + i * k.stride[0] + h * k.stride[1], d, k_inv,
              k_cache.ptr<uint8_t>() + block * k_cache.stride[0] + off * k_cache.stride[1] +
                  h * k_cache.stride[2]);
      }
    }
  });
}

void round_to_fp8(float* x, int64_t n, float scale) {
  const float inv = 1.0f / scale;
  const std::array<float, 256>& e4m3 = e4m3_table();
  for (int64_t i = 0; i < n; ++i) x[i] = scale * e4m3[f32_to_e4m3(x[i] * inv)];
}

namespace {

// The fast path (see the header).
void attention_fp8_fast(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const AttentionMeta& meta, const AttentionParams& params, Tensor& out,
                        const Kernels& kernels) {
  constexpr int32_t kQueryRun = 64;
  const int64_t hq = q.size(1), d = q.size(2);
  const int64_t hkv = k_cache.size(2), dv = v_cache.size(3), group = hq / hkv;
  const int32_t bs = meta.block_size;
  const int32_t* cu = meta.cu_seqlens_q.ptr<int32_t>();
  const int32_t* lens = meta.seq_lens_kv.ptr<int32_t>();
  const int64_t table_stride = meta.block_tables.row_stride();
  struct Item {
    int32_t s, first, n_q;  // sequence, its first query (of the step's), how many
    int64_t kh;             // KV head: its group's query heads read one dequantized context
  };
  std::vector<Item> items;
  for (int32_t s = 0; s < meta.n_seqs; ++s)
    for (int32_t i = cu[s]; i < cu[s + 1]; i += kQueryRun)
      for (int64_t kh = 0; kh < hkv; ++kh)
        items.push_back({s, i, std::min(kQueryRun, cu[s + 1] - i), kh});
  static const int32_t kOneBlock = 0;
  ThreadPool::global().parallel_for(
      static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
        thread_local std::vector<float> kf, vf;  // positions [0, last] of the item's context
        for (int64_t w = b; w < e; ++w) {
          const Item& it = items[w];
          const int32_t s = it.s, n_q = cu[s + 1] - cu[s];
          auto pos_of = [&](int32_t tok) { return lens[s] - n_q + (tok - cu[s]); };
          const int32_t first_pos = pos_of(it.first), last = pos_of(it.first + it.n_q - 1);
          const int32_t lo = params.window > 0 ? std::max(0, first_pos - params.window + 1) : 0;
          if (lens[s] == 0) {  // a padding sequence of a graph batch: no keys, zeros
            for (int32_t t = it.first; t < it.first + it.n_q; ++t)
              for (int64_t g = 0; g < group; ++g)
                std::fill_n(
                    out.ptr<float>() + t * out.stride[0] + (it.kh * group + g) * out.stride[1], dv,
                    0.0f);
            continue;
          }
          const int64_t kh = it.kh;
          kf.resize(static_cast<size_t>(last + 1) * d);
          vf.resize(static_cast<size_t>(last + 1) * dv);
          const int32_t* table = meta.block_tables.ptr<int32_t>() + s * table_stride;
          for (int32_t p = lo; p <= last; ++p) {
            const int64_t blk = table[p / bs], off = p % bs;
            const uint8_t* kr = k_cache.ptr<uint8_t>() + blk * k_cache.stride[0] +
                                off * k_cache.stride[1] + kh * k_cache.stride[2];
            const uint8_t* vr = v_cache.ptr<uint8_t>() + blk * v_cache.stride[0] +
                                off * v_cache.stride[1] + kh * v_cache.stride[2];
            kernels.e4m3_row(kr, d, params.k_scale, kf.data() + static_cast<size_t>(p) * d);
            kernels.e4m3_row(vr, dv, params.v_scale, vf.data() + static_cast<size_t>(p) * dv);
          }
          AttentionRow a;
          a.k_cache = kf.data();
          a.v_cache = vf.data();
          a.k_token_stride = d;
          a.v_token_stride = dv;
          a.block_table = &kOneBlock;
          a.block_size = last + 1;
          a.head_dim = static_cast<int32_t>(d);
          a.head_dim_v = static_cast<int32_t>(dv);
          a.scale = params.scale;
          a.softcap = params.softcap;
          for (int32_t t = it.first; t < it.first + it.n_q; ++t) {
            const int32_t pos = pos_of(t);
            a.kv_begin = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
            a.kv_end = pos + 1;
            for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
              a.q = q.ptr<float>() + t * q.stride[0] + h * q.stride[1];
              a.out = out.ptr<float>() + t * out.stride[0] + h * out.stride[1];
              kernels.attention_row(a);
            }
          }
        }
      });
}

}  // namespace

void attention_fp8(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                   const AttentionMeta& meta, const AttentionParams& params, Tensor& out,
                   const Kernels* kernels) {
  if (kernels) return attention_fp8_fast(q, k_cache, v_cache, meta, params, out, *kernels);
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t hkv = k_cache.size(2), dv = v_cache.size(3), group = hq / hkv;
  const int32_t bs = meta.block_size;
  const int32_t* cu = meta.cu_seqlens_q.ptr<int32_t>();
  const int32_t* lens = meta.seq_lens_kv.ptr<int32_t>();
  const int64_t table_stride = meta.block_tables.row_stride();
  const std::array<float, 256>& e4m3 = e4m3_table();
  std::vector<int32_t> seq_of(n);  // token -> sequence
  for (int32_t s = 0; s < meta.n_seqs; ++s)
    std::fill(seq_of.begin() + cu[s], seq_of.begin() + cu[s + 1], s);
  ThreadPool::global().parallel_for(hq * n, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    std::vector<double> acc(dv);
    for (int64_t item = b; item < e; ++item) {
      const int64_t h = item / n, i = item % n;
      const int32_t s = seq_of[i];
      const int32_t n_q = cu[s + 1] - cu[s];
      const int32_t pos = lens[s] - n_q + static_cast<int32_t>(i - cu[s]);
      float* o = out.ptr<float>() + i * out.stride[0] + h * out.stride[1];
      if (lens[s] == 0) {  // a padding sequence of a graph batch: no keys, zeros
        std::fill_n(o, dv, 0.0f);
        continue;
      }
      const int64_t kh = h / group;
      const int32_t* table = meta.block_tables.ptr<int32_t>() + s * table_stride;
      const float* qv = q.ptr<float>() + i * q.stride[0] + h * q.stride[1];
      auto k_at = [&](int32_t p) {
        return Decoded{k_cache.ptr<uint8_t>() + table[p / bs] * k_cache.stride[0] +
                           (p % bs) * k_cache.stride[1] + kh * k_cache.stride[2],
                       params.k_scale, e4m3};
      };
      auto v_at = [&](int32_t p) {
        return Decoded{v_cache.ptr<uint8_t>() + table[p / bs] * v_cache.stride[0] +
                           (p % bs) * v_cache.stride[1] + kh * v_cache.stride[2],
                       params.v_scale, e4m3};
      };
      const int32_t lo = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      ref::attention_row(qv, d, dv, lo, pos, params, k_at, v_at, scores, acc, o);
    }
  });
}

}  // namespace pagellm::cpu
