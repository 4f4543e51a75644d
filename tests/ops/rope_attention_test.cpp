// rope_attention against the CPU reference (rope_store_kv, then attention): decode steps, where
// the CUDA decode kernel rotates q and stores the new key and value itself, on batches of short
// and long contexts (the new token's split owning the store), GQA, MQA, both rotation layouts,
// partial rotary dims, block sizes 16 and 32, launches planned for a longer bound (as a decode
// graph is), and a padding token whose slot is -1; plus unaligned head rows, which run the two
// ops apart.
//
// Tolerance. The GPU keeps q and the cache in bf16, so the reference's rotated q and keys are
// rounded to bf16 before its attention (rotation itself is exact to float rounding on both
// sides); the output then differs by the attention kernels' own rounding (kBf16Tol, as in
// attention_test.cpp), the key cache by at most a bf16 rounding of the rotation (kBf16Tol), and
// the value cache not at all.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

struct RopeAttnCase {
  int64_t hq, hkv, d, dv, rd;
  bool interleaved;
  int32_t block_size;
  std::vector<int32_t> kv_lens;  // each sequence's cache length, its new token included
  int32_t plan = 0;              // meta.max_seqlen_kv when above the longest (a graph's bound)
  bool pad_last = false;         // the last sequence's new token has slot -1 (not stored)
};

void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = round_bf16(x);
}

void run_case(Backend& cuda, Backend& cpu, uint64_t seed, const RopeAttnCase& c) {
  Rng rng(seed);
  const int32_t n_seqs = static_cast<int32_t>(c.kv_lens.size());
  const int32_t bs = c.block_size;
  std::vector<int32_t> cu(n_seqs + 1, 0), lens = c.kv_lens;
  int32_t max_kv = 0, max_blocks = 0, total_blocks = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    cu[s + 1] = cu[s] + 1;  // one query: a decode step
    max_kv = std::max(max_kv, lens[s]);
    max_blocks = std::max(max_blocks, (lens[s] + bs - 1) / bs);
    total_blocks += (lens[s] + bs - 1) / bs;
  }
  const int64_t n = cu[n_seqs];
  // Shuffled blocks, padded table rows; the new tokens' slots are their positions' table slots.
  const int64_t pool = total_blocks + 3;
  std::vector<int32_t> perm(pool);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = pool - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  const int64_t table_ld = max_blocks + 2;
  std::vector<int32_t> table(n_seqs * table_ld, -1), slots(n);
  int64_t next = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[s * table_ld + b] = perm[next++];
    const int32_t pos = lens[s] - 1;
    const bool pad = c.pad_last && s == n_seqs - 1;
    slots[s] = pad ? -1 : table[s * table_ld + pos / bs] * bs + pos % bs;
  }
  std::vector<float> q = random_bf16_values(rng, n * c.hq * c.d, 2.0f);
  std::vector<float> k = random_bf16_values(rng, n * c.hkv * c.d, 2.0f);
  std::vector<float> v = random_bf16_values(rng, n * c.hkv * c.dv, 2.0f);
  std::vector<float> kc = random_bf16_values(rng, pool * bs * c.hkv * c.d);
  std::vector<float> vc = random_bf16_values(rng, pool * bs * c.hkv * c.dv);
  std::vector<float> cs(n * c.rd);
  for (int64_t i = 0; i < n; ++i) {
    const double pos = static_cast<double>(rng.below(8192));
    for (int64_t j = 0; j < c.rd / 2; ++j) {
      const double angle = pos * std::pow(10000.0, -2.0 * static_cast<double>(j) / c.rd);
      cs[i * c.rd + j] = static_cast<float>(std::cos(angle));
      cs[i * c.rd + c.rd / 2 + j] = static_cast<float>(std::sin(angle));
    }
  }

  auto q_dev = upload_bf16(cuda, q), k_dev = upload_bf16(cuda, k), v_dev = upload_bf16(cuda, v);
  auto kc_dev = upload_bf16(cuda, kc), vc_dev = upload_bf16(cuda, vc);
  auto cs_dev = upload_raw(cuda, cs), slots_dev = upload_raw(cuda, slots);
  auto cu_dev = upload_raw(cuda, cu), lens_dev = upload_raw(cuda, lens),
       table_dev = upload_raw(cuda, table);
  DevBuf out(cuda, n * c.hq * c.dv * 2);
  AttentionMeta meta;
  meta.n_seqs = n_seqs;
  meta.cu_seqlens_q = cu_dev->view(DType::kI32, {n_seqs + 1});
  meta.seq_lens_kv = lens_dev->view(DType::kI32, {n_seqs});
  meta.block_tables = table_dev->view(DType::kI32, {n_seqs, table_ld});
  meta.block_size = bs;
  meta.max_seqlen_q = 1;
  meta.max_seqlen_kv = std::max(max_kv, c.plan);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  Tensor q_t = q_dev->view(DType::kBF16, {n, c.hq, c.d});
  Tensor k_t = k_dev->view(DType::kBF16, {n, c.hkv, c.d});
  Tensor kc_t = kc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.d});
  Tensor vc_t = vc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.dv});
  Tensor out_t = out.view(DType::kBF16, {n, c.hq, c.dv});
  cuda.rope_attention(q_t, k_t, v_dev->view(DType::kBF16, {n, c.hkv, c.dv}),
                      cs_dev->view(DType::kF32, {n, c.rd}), c.interleaved,
                      slots_dev->view(DType::kI32, {n}), kc_t, vc_t, meta, params, out_t);

  // The reference: the two ops on the CPU, q and the keys rounded to bf16 in between.
  std::vector<float> want(n * c.hq * c.dv), qr = q, kr = k, kcr = kc, vcr = vc, vr = v;
  Tensor qh = host_f32(qr, {n, c.hq, c.d}), kh = host_f32(kr, {n, c.hkv, c.d});
  Tensor kch = host_f32(kcr, {pool, bs, c.hkv, c.d}), vch = host_f32(vcr, {pool, bs, c.hkv, c.dv});
  cpu.rope_store_kv(qh, kh, host_f32(vr, {n, c.hkv, c.dv}), host_f32(cs, {n, c.rd}),
                    c.interleaved, Tensor(slots.data(), DType::kI32, {n}), kch, vch);
  round_to_bf16(qr);
  round_to_bf16(kcr);
  AttentionMeta hmeta = meta;
  hmeta.cu_seqlens_q = Tensor(cu.data(), DType::kI32, {n_seqs + 1});
  hmeta.seq_lens_kv = Tensor(lens.data(), DType::kI32, {n_seqs});
  hmeta.block_tables = Tensor(table.data(), DType::kI32, {n_seqs, table_ld});
  Tensor want_t = host_f32(want, {n, c.hq, c.dv});
  cpu.attention(qh, kch, vch, hmeta, params, want_t);

  std::ostringstream kv;
  for (int32_t l : c.kv_lens) kv << l << ",";
  const std::string what =
      Label("rope_attention", seed)("hq", c.hq)("hkv", c.hkv)("d", c.d)("dv", c.dv)("rd", c.rd)(
          "interleaved", c.interleaved)("block_size", bs)("plan", c.plan)(
          "pad_last", c.pad_last)("kv_lens", kv.str());
  EXPECT_TRUE(compare(what + " out", download_bf16(out), want, kBf16Tol));
  EXPECT_TRUE(compare(what + " k_cache", download_bf16(*kc_dev), kcr, kBf16Tol));
  EXPECT_TRUE(compare(what + " v_cache", download_bf16(*vc_dev), vcr, kExact));
  for (const DevBuf* b : {&out, kc_dev.get(), vc_dev.get()}) EXPECT_TRUE(guards_ok(what, *b));
}

TEST(RopeAttention, DecodeMatchesReference) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9900;
  int cases = 0;
  for (bool interleaved : {false, true}) {
    // Llama-3-8B heads: short and long contexts, one launch planned for a graph's bound.
    run_case(cuda, cpu, ++seed, {32, 8, 128, 128, 128, interleaved, 16, {1, 7, 19, 111, 600}});
    run_case(cuda, cpu, ++seed, {32, 8, 128, 128, 128, interleaved, 16, {513, 40}, 8192});
    run_case(cuda, cpu, ++seed, {32, 8, 128, 128, 128, interleaved, 16, {5000}});
    // Partial rotary, MQA, Dv != D, block 32, a padding token.
    run_case(cuda, cpu, ++seed, {16, 1, 64, 64, 32, interleaved, 32, {33, 700}, 0, true});
    run_case(cuda, cpu, ++seed, {8, 2, 128, 64, 64, interleaved, 16, {1, 250}});
    cases += 5;
  }
  EXPECT_EQ(cases, 10);
}

// Head rows the kernel cannot load in 16-byte pieces: the two ops run apart, same results.
// (Prefill steps run them apart too; attention_test.cpp and rope_kv_test.cpp cover those.)
TEST(RopeAttention, UnalignedRowsRunApart) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 9950;
  run_case(cuda, cpu, ++seed, {8, 2, 36, 36, 36, false, 16, {5, 70}});
  run_case(cuda, cpu, ++seed, {8, 2, 36, 36, 12, true, 16, {300}});
}

}  // namespace
}  // namespace pagellm::optest
