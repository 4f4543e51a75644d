// Paged attention, rotary embedding and the KV store: the reference against naive computations on
// contiguous copies (double precision), and every fast ISA path against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace pagellm::testing {
namespace {

struct AttnCase {
  const char* name;
  int64_t hq, hkv, d, dv;
  int32_t block_size;
  int32_t window;
  float softcap;
  float scale;  // 0: 1/sqrt(d)
  std::vector<int32_t> lens;  // KV tokens per sequence (new ones included)
  std::vector<int32_t> n_q;   // query tokens per sequence: the last n_q of its lens
};

std::vector<AttnCase> attn_cases() {
  return {
      // decode (1 query), full prefill (n_q == len), a prefix-cached chunk (n_q < len), GQA 8:2
      {"gqa8:2", 8, 2, 64, 64, 16, -1, 0.0f, 0.0f, {1, 7, 19, 40}, {1, 7, 5, 1}},
      // MQA with a sliding window, tiny blocks, Dv != D
      {"mqa8:1-window6", 8, 1, 32, 48, 4, 6, 0.0f, 0.0f, {33, 5, 17}, {9, 5, 1}},
      // head_dim off the vector width, soft-capped scores made large enough for the cap to bite
      {"mha4-softcap", 4, 4, 80, 80, 8, -1, 5.0f, 1.0f, {70, 3}, {70, 2}},
      // blocks longer than the fast path's 64-key score chunk; window of one token
      {"bigblock", 2, 1, 128, 128, 128, -1, 0.0f, 0.0f, {300, 130}, {3, 130}},
      {"window1", 4, 2, 16, 16, 4, 1, 0.0f, 0.0f, {9, 12}, {9, 2}},
  };
}

// A batch laid out in a paged cache whose unused slots hold NaN: reading one poisons the output.
struct AttnData {
  const AttnCase& c;
  int64_t n = 0, n_blocks = 0, max_blocks = 0;
  std::vector<int32_t> cu, lens, table;
  std::vector<float> k_cache, v_cache, q;
  AttentionMeta meta;
  AttentionParams params;
  Tensor qt, kt, vt;

  AttnData(const AttnCase& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    const int32_t n_seqs = static_cast<int32_t>(c.lens.size());
    cu.push_back(0);
    for (int32_t s = 0; s < n_seqs; ++s) {
      cu.push_back(cu.back() + c.n_q[s]);
      const int64_t nb = (c.lens[s] + c.block_size - 1) / c.block_size;
      n_blocks += nb;
      max_blocks = std::max(max_blocks, nb + 1);
    }
    n = cu.back();
    n_blocks += 3;  // spare blocks nobody owns
    lens = c.lens;
    // Sequences own shuffled physical blocks; the table's extra entries point nowhere valid.
    std::vector<int32_t> ids(n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(n_seqs * max_blocks, -1);
    int next = 0;
    for (int32_t s = 0; s < n_seqs; ++s)
      for (int64_t b = 0; b < (c.lens[s] + c.block_size - 1) / c.block_size; ++b)
        table[s * max_blocks + b] = ids[next++];
    const float nan = std::numeric_limits<float>::quiet_NaN();
    k_cache.assign(n_blocks * c.block_size * c.hkv * c.d, nan);
    v_cache.assign(n_blocks * c.block_size * c.hkv * c.dv, nan);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int32_t s = 0; s < n_seqs; ++s)
      for (int32_t p = 0; p < c.lens[s]; ++p)
        for (int64_t h = 0; h < c.hkv; ++h) {
          for (int64_t e = 0; e < c.d; ++e) *k_at(s, p, h, e) = dist(rng);
          for (int64_t e = 0; e < c.dv; ++e) *v_at(s, p, h, e) = dist(rng);
        }
    q = random_floats(rng, n * c.hq * c.d);
    meta.n_seqs = n_seqs;
    meta.cu_seqlens_q = Tensor(cu.data(), DType::kI32, {n_seqs + 1});
    meta.seq_lens_kv = Tensor(lens.data(), DType::kI32, {n_seqs});
    meta.block_tables = Tensor(table.data(), DType::kI32, {n_seqs, max_blocks});
    meta.block_size = c.block_size;
    meta.max_seqlen_q = *std::max_element(c.n_q.begin(), c.n_q.end());
    meta.max_seqlen_kv = *std::max_element(c.lens.begin(), c.lens.end());
    params.scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(float(c.d));
    params.window = c.window;
    params.softcap = c.softcap;
    qt = Tensor(q.data(), DType::kF32, {n, c.hq, c.d});
    kt = Tensor(k_cache.data(), DType::kF32, {n_blocks, c.block_size, c.hkv, c.d});
    vt = Tensor(v_cache.data(), DType::kF32, {n_blocks, c.block_size, c.hkv, c.dv});
  }
  float* k_at(int32_t s, int32_t p, int64_t h, int64_t e) {
    const int64_t blk = table[s * max_blocks + p / c.block_size];
    return &k_cache[((blk * c.block_size + p % c.block_size) * c.hkv + h) * c.d + e];
  }
  float* v_at(int32_t s, int32_t p, int64_t h, int64_t e) {
    const int64_t blk = table[s * max_blocks + p / c.block_size];
    return &v_cache[((blk * c.block_size + p % c.block_size) * c.hkv + h) * c.dv + e];
  }
  GuardedBuffer run(Backend& be) {
    GuardedBuffer out(n * c.hq * c.dv);
    Tensor ot(out.ptr(), DType::kF32, {n, c.hq, c.dv});
    be.attention(qt, kt, vt, meta, params, ot);
    return out;
  }
  // Softmax attention straight from the definition, in double.
  std::vector<double> naive() {
    std::vector<double> out(n * c.hq * c.dv, 0.0);
    const int64_t group = c.hq / c.hkv;
    for (int32_t s = 0; s < meta.n_seqs; ++s)
      for (int32_t i = 0; i < c.n_q[s]; ++i) {
        const int64_t tok = cu[s] + i;
        const int32_t pos = c.lens[s] - c.n_q[s] + i;
        const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int64_t h = 0; h < c.hq; ++h) {
          std::vector<double> sc;
          for (int32_t p = lo; p <= pos; ++p) {
            double dot = 0;
            for (int64_t e = 0; e < c.d; ++e)
              dot += double(q[(tok * c.hq + h) * c.d + e]) * *k_at(s, p, h / group, e);
            double x = dot * params.scale;
            if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
            sc.push_back(x);
          }
          const double mx = *std::max_element(sc.begin(), sc.end());
          double sum = 0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int32_t p = lo; p <= pos; ++p)
            for (int64_t e = 0; e < c.dv; ++e)
              out[(tok * c.hq + h) * c.dv + e] += sc[p - lo] / sum * *v_at(s, p, h / group, e);
        }
      }
    return out;
  }
};

// Outputs are convex combinations of values in [-1, 1]; f32 scores and sums leave ~1e-6 error.
constexpr double kAttnTol = 2e-5;

TEST(CpuAttention, ReferenceMatchesNaive) {
  auto ref = make_cpu_backend(false);
  int64_t checked = 0;
  uint32_t seed = 300;
  for (const AttnCase& c : attn_cases()) {
    const std::string ctx = std::string(c.name) + " seed=" + std::to_string(++seed);
    AttnData d(c, seed);
    GuardedBuffer got = d.run(*ref);
    ASSERT_TRUE(got.guard_intact()) << ctx;
    const std::vector<double> want = d.naive();
    for (size_t i = 0; i < want.size(); ++i, ++checked) {
      PAGELLM_EXPECT_CLOSE(got.data[i], want[i], kAttnTol, ctx, i);
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuAttention, FastMatchesReference) {
  auto ref = make_cpu_backend(false);
  auto fast = fast_backends();
  if (fast.empty()) GTEST_SKIP() << "no fast path on this CPU";
  int64_t checked = 0;
  for (auto& [isa, be] : fast) {
    uint32_t seed = 400;
    for (const AttnCase& c : attn_cases()) {
      const std::string ctx = isa + " " + c.name + " seed=" + std::to_string(++seed);
      AttnData d(c, seed);
      GuardedBuffer want = d.run(*ref);
      GuardedBuffer got = d.run(*be);
      ASSERT_TRUE(got.guard_intact()) << ctx;
      for (int64_t i = 0; i < got.n; ++i, ++checked) {
        PAGELLM_EXPECT_CLOSE(got.data[i], want.data[i], kAttnTol, ctx, i);
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(checked, 0);
}

// attention_project's default: attention into `attn`, then each head's output times that head's
// matrix, equal bit for bit to one matmul per head on the attention's own output; the output
// is a column slice of a wider buffer (its other columns untouched) and w a strided view.
TEST(CpuAttention, ProjectIsAttentionThenEachHeadsProduct) {
  for (bool fast : {false, true}) {
    auto be = make_cpu_backend(fast);
    uint32_t seed = 500;
    for (const AttnCase& c : attn_cases()) {
      const std::string ctx = std::string(c.name) + (fast ? " fast" : " reference");
      AttnData d(c, ++seed);
      std::mt19937 rng(seed);
      const int64_t m = 6, w_rows = m + 3;  // each head's m rows start 3 rows into its block
      std::vector<float> w = random_floats(rng, c.hq * w_rows * c.dv);
      Tensor wt(w.data() + 3 * c.dv, DType::kF32, {c.hq, m, c.dv});
      wt.stride = {w_rows * c.dv, c.dv, 1, 0};
      std::vector<float> attn(d.n * c.hq * c.dv);
      Tensor attn_t(attn.data(), DType::kF32, {d.n, c.hq, c.dv});
      constexpr float kUntouched = 12345.0f;
      const int64_t ld = c.hq * m + 5;  // out: columns [0, hq * m) of rows ld wide
      std::vector<float> out(d.n * ld, kUntouched);
      Tensor out_t = Tensor(out.data(), DType::kF32, {d.n, ld}).slice_cols(0, c.hq * m);
      Tensor out3 = out_t.split_heads(c.hq, m);
      be->attention_project(d.qt, d.kt, d.vt, d.meta, d.params, wt, attn_t, out3);

      GuardedBuffer want_attn = d.run(*be);
      for (int64_t i = 0; i < want_attn.n; ++i)
        ASSERT_EQ(attn[i], want_attn.data[i]) << ctx << ": attention output " << i;
      for (int64_t h = 0; h < c.hq; ++h) {
        std::vector<float> want(d.n * m);
        Tensor want_t(want.data(), DType::kF32, {d.n, m});
        Tensor x(attn.data() + h * c.dv, DType::kF32, {d.n, c.dv});
        x.stride = {c.hq * c.dv, 1, 0, 0};
        Tensor wh(w.data() + (h * w_rows + 3) * c.dv, DType::kF32, {m, c.dv});
        be->matmul(x, wh, Tensor(), want_t);
        for (int64_t t = 0; t < d.n; ++t)
          for (int64_t r = 0; r < m; ++r)
            ASSERT_EQ(out[t * ld + h * m + r], want[t * m + r])
                << ctx << ": token " << t << " head " << h << " row " << r;
      }
      for (int64_t t = 0; t < d.n; ++t)
        for (int64_t j = c.hq * m; j < ld; ++j)
          ASSERT_EQ(out[t * ld + j], kUntouched) << ctx << ": written outside the view";
    }
  }
}

// --- rope ---

// cos_sin [n, rotary_dim] for the given positions: cos of the rotary_dim/2 frequencies, then sin.
std::vector<float> make_cos_sin(const std::vector<int>& pos, int64_t rotary_dim) {
  std::vector<float> cs(pos.size() * rotary_dim);
  const int64_t half = rotary_dim / 2;
  for (size_t i = 0; i < pos.size(); ++i)
    for (int64_t j = 0; j < half; ++j) {
      const double inv_freq = std::pow(10000.0, -2.0 * j / rotary_dim);
      cs[i * rotary_dim + j] = static_cast<float>(std::cos(pos[i] * inv_freq));
      cs[i * rotary_dim + half + j] = static_cast<float>(std::sin(pos[i] * inv_freq));
    }
  return cs;
}

// Rotates (x[a], x[b]) by the angle whose cos/sin are given, in double.
void naive_rope(std::vector<double>& x, int64_t base, const float* cs, int64_t rotary_dim,
                bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const int64_t a = base + (interleaved ? 2 * j : j);
    const int64_t b = base + (interleaved ? 2 * j + 1 : j + half);
    const double c = cs[j], s = cs[half + j], x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x1 * c + x0 * s;
  }
}

TEST(CpuRope, BothStylesPartialRotaryStridedHeads) {
  auto ref = make_cpu_backend(false);
  std::vector<NamedBackend> all = fast_backends();
  all.insert(all.begin(), NamedBackend{"reference", std::move(ref)});
  const int64_t n = 7, h = 3, d = 64, width = (h + 2) * d;  // q is a slice of a fused [n, 5*64]
  const std::vector<int> pos = {0, 1, 2, 17, 100, 1000, 4095};
  int64_t checked = 0;
  uint32_t seed = 500;
  for (auto& [isa, be] : all) {
    for (bool interleaved : {false, true}) {
      for (int64_t rotary_dim : {d, d / 2}) {
        const std::string ctx = isa + (interleaved ? " interleaved" : " half") + " rotary_dim=" +
                                std::to_string(rotary_dim) + " seed=" + std::to_string(++seed);
        std::mt19937 rng(seed);
        GuardedBuffer buf(n * width);
        const std::vector<float> init = random_floats(rng, n * width);
        std::copy(init.begin(), init.end(), buf.data.begin());
        std::vector<float> cs = make_cos_sin(pos, rotary_dim);
        Tensor x(buf.ptr(), DType::kF32, {n, h, d});
        x.stride[0] = width;
        be->rope(x, Tensor(cs.data(), DType::kF32, {n, rotary_dim}), interleaved);
        ASSERT_TRUE(buf.guard_intact()) << ctx;
        std::vector<double> want(init.begin(), init.end());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t hh = 0; hh < h; ++hh)
            naive_rope(want, i * width + hh * d, &cs[i * rotary_dim], rotary_dim, interleaved);
        // One rotation in f32: a few ulp of values in [-1, 1]. Columns past the heads (the rest
        // of the fused buffer) and past rotary_dim come back bit-identical.
        for (int64_t i = 0; i < n * width; ++i, ++checked) {
          PAGELLM_EXPECT_CLOSE(buf.data[i], want[i], 1e-6, ctx, i);
        }
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CpuRope, StoreKvWritesMappedSlotsOnly) {
  std::vector<NamedBackend> all = fast_backends();
  all.insert(all.begin(), NamedBackend{"reference", make_cpu_backend(false)});
  auto ref = make_cpu_backend(false);
  const int64_t n = 6, hq = 4, hkv = 2, d = 32, dv = 24, n_blocks = 4, bs = 4;
  const std::vector<int> pos = {3, 4, 5, 6, 7, 8};
  // Token 2 is padding (-1); the rest go to scattered slots of blocks 3 and 1.
  std::vector<int32_t> slots = {12, 13, -1, 15, 4, 5};
  int64_t checked = 0;
  uint32_t seed = 600;
  for (bool interleaved : {false, true}) {
    for (auto& [isa, be] : all) {
      const std::string ctx = isa + (interleaved ? " interleaved" : " half") + " seed=" +
                              std::to_string(++seed);
      std::mt19937 rng(seed);
      std::vector<float> q = random_floats(rng, n * hq * d), k = random_floats(rng, n * hkv * d);
      std::vector<float> v = random_floats(rng, n * hkv * dv);
      std::vector<float> cs = make_cos_sin(pos, d);
      std::vector<float> q2 = q, k2 = k;  // expected rotations, from the plain rope op
      Tensor cst(cs.data(), DType::kF32, {n, d});
      Tensor q2t(q2.data(), DType::kF32, {n, hq, d}), k2t(k2.data(), DType::kF32, {n, hkv, d});
      ref->rope(q2t, cst, interleaved);
      ref->rope(k2t, cst, interleaved);
      GuardedBuffer kc(n_blocks * bs * hkv * d), vc(n_blocks * bs * hkv * dv);
      Tensor qt(q.data(), DType::kF32, {n, hq, d}), kt(k.data(), DType::kF32, {n, hkv, d});
      Tensor vt(v.data(), DType::kF32, {n, hkv, dv});
      Tensor kct(kc.ptr(), DType::kF32, {n_blocks, bs, hkv, d});
      Tensor vct(vc.ptr(), DType::kF32, {n_blocks, bs, hkv, dv});
      be->rope_store_kv(qt, kt, vt, cst, interleaved, Tensor(slots.data(), DType::kI32, {n}), kct,
                        vct, 1.0f, 1.0f);
      ASSERT_TRUE(kc.guard_intact() && vc.guard_intact()) << ctx;
      for (size_t i = 0; i < q.size(); ++i, ++checked) {
        PAGELLM_EXPECT_CLOSE(q[i], q2[i], 1e-6, ctx + " q", i);
      }
      for (size_t i = 0; i < k.size(); ++i, ++checked) {
        PAGELLM_EXPECT_CLOSE(k[i], k2[i], 1e-6, ctx + " k", i);
      }
      // Every cache slot: the token mapped to it, or untouched.
      for (int64_t slot = 0; slot < n_blocks * bs; ++slot) {
        const auto it = std::find(slots.begin(), slots.end(), slot);
        const int64_t tok = it == slots.end() ? -1 : it - slots.begin();
        for (int64_t e = 0; e < hkv * d; ++e, ++checked) {
          const float want = tok < 0 ? kSentinel : k[tok * hkv * d + e];
          ASSERT_EQ(kc.data[slot * hkv * d + e], want) << ctx << " k_cache slot " << slot;
        }
        for (int64_t e = 0; e < hkv * dv; ++e, ++checked) {
          const float want = tok < 0 ? kSentinel : v[tok * hkv * dv + e];
          ASSERT_EQ(vc.data[slot * hkv * dv + e], want) << ctx << " v_cache slot " << slot;
        }
      }
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(checked, 0);
}

// An FP8 cache (float8_e4m3fn, a scale for keys and one for values): attention over it equals,
// the same backend's attention over the cache dequantized to f32 (scale * e4m3(code)): bit for
// bit on the reference loops, within f32 summation order on the fast kernels; unused slots hold
// NaN codes, which must never be read.
TEST(CpuAttention, Fp8CacheReadsAsItsDequantizedValues) {
  int64_t checked = 0;
  uint32_t seed = 700;
  std::vector<NamedBackend> all = fast_backends();  // every ISA this CPU has
  all.insert(all.begin(), NamedBackend{"reference", make_cpu_backend(false)});
  for (auto& [isa, be] : all) {
    const bool fast = isa != "reference";
    for (const AttnCase& c : attn_cases()) {
      const std::string ctx = std::string(c.name) + " " + isa;
      AttnData d(c, ++seed);
      d.params.k_scale = 0.05f;   // [-1, 1] -> [-20, 20] stored
      d.params.v_scale = 0.004f;  // [-1, 1] -> [-250, 250]
      auto quantize = [](std::vector<float>& cache, float scale) {
        std::vector<uint8_t> codes(cache.size());
        for (size_t i = 0; i < cache.size(); ++i) {
          codes[i] = std::isnan(cache[i]) ? uint8_t{0x7f} : f32_to_e4m3(cache[i] / scale);
          if (!std::isnan(cache[i])) cache[i] = scale * e4m3_to_f32(codes[i]);
        }
        return codes;
      };
      std::vector<uint8_t> k8 = quantize(d.k_cache, d.params.k_scale);
      std::vector<uint8_t> v8 = quantize(d.v_cache, d.params.v_scale);
      GuardedBuffer want = d.run(*be);  // f32 caches holding the dequantized values
      Tensor k8t(k8.data(), DType::kF8E4M3, {d.kt.size(0), c.block_size, c.hkv, c.d});
      Tensor v8t(v8.data(), DType::kF8E4M3, {d.vt.size(0), c.block_size, c.hkv, c.dv});
      GuardedBuffer got(d.n * c.hq * c.dv);
      Tensor ot(got.ptr(), DType::kF32, {d.n, c.hq, c.dv});
      be->attention(d.qt, k8t, v8t, d.meta, d.params, ot);
      ASSERT_TRUE(got.guard_intact()) << ctx;
      for (int64_t i = 0; i < got.n; ++i, ++checked) {
        // The reference loops are the same arithmetic; the fast kernel reads the dequantized
        // context as one block, which chunks its sums differently from 16-token blocks.
        if (fast) {
          PAGELLM_EXPECT_CLOSE(got.data[i], want.data[i], kAttnTol, ctx, i);
        } else {
          ASSERT_EQ(got.data[i], want.data[i]) << ctx << " element " << i;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// rope_store_kv into FP8 caches: each mapped slot holds e4m3(rotated k / k_scale) and e4m3(v /
// v_scale), values past 448 saturated; padding and other slots keep their bytes.
TEST(CpuRope, StoreKvFp8WritesScaledCodes) {
  for (bool fast : {false, true}) {
    auto be = make_cpu_backend(fast);
    auto ref = make_cpu_backend(false);
    const int64_t n = 5, hq = 2, hkv = 2, d = 16, dv = 8, n_blocks = 3, bs = 4;
    std::vector<int32_t> slots = {7, -1, 0, 11, 3}, pos = {0, 1, 2, 3, 4};
    std::mt19937 rng(fast ? 91 : 90);
    std::vector<float> q = random_floats(rng, n * hq * d), k = random_floats(rng, n * hkv * d);
    std::vector<float> v = random_floats(rng, n * hkv * dv);
    v[3] = 5000.0f;  // past 448 * v_scale: saturates
    std::vector<float> cs = make_cos_sin(pos, d), k2 = k;
    Tensor cst(cs.data(), DType::kF32, {n, d});
    Tensor k2t(k2.data(), DType::kF32, {n, hkv, d});
    ref->rope(k2t, cst, false);
    std::vector<uint8_t> kc(n_blocks * bs * hkv * d, 0xAA), vc(n_blocks * bs * hkv * dv, 0xAA);
    Tensor qt(q.data(), DType::kF32, {n, hq, d}), kt(k.data(), DType::kF32, {n, hkv, d});
    Tensor vt(v.data(), DType::kF32, {n, hkv, dv});
    Tensor kct(kc.data(), DType::kF8E4M3, {n_blocks, bs, hkv, d});
    Tensor vct(vc.data(), DType::kF8E4M3, {n_blocks, bs, hkv, dv});
    const float k_scale = 0.5f, v_scale = 0.25f;
    be->rope_store_kv(qt, kt, vt, cst, false, Tensor(slots.data(), DType::kI32, {n}), kct, vct,
                      k_scale, v_scale);
    for (int64_t slot = 0; slot < n_blocks * bs; ++slot) {
      const auto it = std::find(slots.begin(), slots.end(), slot);
      const int64_t tok = it == slots.end() ? -1 : it - slots.begin();
      for (int64_t e = 0; e < hkv * d; ++e) {
        const uint8_t want = tok < 0 ? 0xAA : f32_to_e4m3(k2[tok * hkv * d + e] / k_scale);
        ASSERT_EQ(kc[slot * hkv * d + e], want) << "k slot " << slot << " element " << e;
      }
      for (int64_t e = 0; e < hkv * dv; ++e) {
        const uint8_t want = tok < 0 ? 0xAA : f32_to_e4m3(v[tok * hkv * dv + e] / v_scale);
        ASSERT_EQ(vc[slot * hkv * dv + e], want) << "v slot " << slot << " element " << e;
      }
    }
    EXPECT_EQ(e4m3_to_f32(vc[7 * hkv * dv + 3]), 448.0f);  // token 0's v[3], saturated
  }
}

}  // namespace
}  // namespace pagellm::testing
