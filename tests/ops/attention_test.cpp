// Paged attention against the CPU reference: decode batches (split-KV and its reduction), ragged
// prefill with cached prefixes, mixed batches, GQA 32:8, MQA, MHA, head dims 64/80/128/256,
// sliding windows, soft-capping, block sizes 8/16/32, shuffled (non-consecutive) block tables with
// padded rows, and sequences that have no query in the step.
#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

struct Seq {
  int32_t n_q;     // queries in this step (the last n_q of the sequence's tokens)
  int32_t kv_len;  // tokens in the cache, the new ones included
};

struct AttnCase {
  int64_t hq, hkv, d, dv;
  int32_t block_size;
  std::vector<Seq> seqs;
  int32_t window = -1;
  float softcap = 0.0f;
  float q_amp = 1.0f;  // larger makes the softmax peakier
};

void run_attention_case(Backend& cuda, Backend& cpu, uint64_t seed, const AttnCase& c) {
  Rng rng(seed);
  const int32_t n_seqs = static_cast<int32_t>(c.seqs.size());
  const int32_t bs = c.block_size;
  std::vector<int32_t> cu(n_seqs + 1, 0), lens(n_seqs);
  int32_t max_q = 0, max_kv = 0, max_blocks = 0, total_blocks = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    cu[s + 1] = cu[s] + c.seqs[s].n_q;
    lens[s] = c.seqs[s].kv_len;
    max_q = std::max(max_q, c.seqs[s].n_q);
    max_kv = std::max(max_kv, c.seqs[s].kv_len);
    const int32_t nb = (c.seqs[s].kv_len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  const int64_t n = cu[n_seqs];
  // A pool with spare blocks, handed out in shuffled order so no sequence's blocks are consecutive.
  const int64_t pool = total_blocks + 5;
  std::vector<int32_t> perm(pool);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = pool - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  const int64_t table_ld = max_blocks + 3;  // padded rows: entries past a sequence's blocks are -1
  std::vector<int32_t> table(n_seqs * table_ld, -1);
  int64_t next = 0;
  for (int32_t s = 0; s < n_seqs; ++s)
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[s * table_ld + b] = perm[next++];

  std::vector<float> q = random_bf16_values(rng, n * c.hq * c.d, c.q_amp);
  std::vector<float> kc = random_bf16_values(rng, pool * bs * c.hkv * c.d);
  std::vector<float> vc = random_bf16_values(rng, pool * bs * c.hkv * c.dv);

  auto q_dev = upload_bf16(cuda, q), kc_dev = upload_bf16(cuda, kc), vc_dev = upload_bf16(cuda, vc);
  auto cu_dev = upload_raw(cuda, cu), lens_dev = upload_raw(cuda, lens),
       table_dev = upload_raw(cuda, table);
  DevBuf out(cuda, std::max<int64_t>(n, 1) * c.hq * c.dv * 2);
  AttentionMeta meta;
  meta.n_seqs = n_seqs;
  meta.cu_seqlens_q = cu_dev->view(DType::kI32, {n_seqs + 1});
  meta.seq_lens_kv = lens_dev->view(DType::kI32, {n_seqs});
  meta.block_tables = table_dev->view(DType::kI32, {n_seqs, table_ld});
  meta.block_size = bs;
  meta.max_seqlen_q = max_q;
  meta.max_seqlen_kv = max_kv;
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  params.window = c.window;
  params.softcap = c.softcap;
  Tensor out_t = out.view(DType::kBF16, {n, c.hq, c.dv});
  cuda.attention(q_dev->view(DType::kBF16, {n, c.hq, c.d}),
                 kc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.d}),
                 vc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.dv}), meta, params, out_t);

  AttentionMeta hmeta = meta;
  hmeta.cu_seqlens_q = Tensor(cu.data(), DType::kI32, {n_seqs + 1});
  hmeta.seq_lens_kv = Tensor(lens.data(), DType::kI32, {n_seqs});
  hmeta.block_tables = Tensor(table.data(), DType::kI32, {n_seqs, table_ld});
  std::vector<float> want(n * c.hq * c.dv);
  Tensor want_t = host_f32(want, {n, c.hq, c.dv});
  cpu.attention(host_f32(q, {n, c.hq, c.d}), host_f32(kc, {pool, bs, c.hkv, c.d}),
                host_f32(vc, {pool, bs, c.hkv, c.dv}), hmeta, params, want_t);

  std::ostringstream seqs;
  for (const Seq& s : c.seqs) seqs << s.n_q << "/" << s.kv_len << ",";
  const std::string what = Label("attention", seed)("hq", c.hq)("hkv", c.hkv)("d", c.d)("dv", c.dv)(
      "block_size", bs)("window", c.window)("softcap", c.softcap)("q_amp", c.q_amp)(
      "path", max_q == 1 ? "decode" : "prefill")("seqs(n_q/kv)", seqs.str());
  std::vector<float> got = download_bf16(out);
  got.resize(want.size());
  EXPECT_TRUE(compare(what, got, want, kBf16Tol));
  EXPECT_TRUE(guards_ok(what, out));
}

std::vector<Seq> decode_seqs(std::initializer_list<int32_t> kv_lens) {
  std::vector<Seq> s;
  for (int32_t l : kv_lens) s.push_back({1, l});
  return s;
}

TEST(AttentionDecode, Gqa32x8SplitKv) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4000;
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, decode_seqs({1})});
  run_attention_case(cuda, cpu, ++seed,
                     {32, 8, 128, 128, 16, decode_seqs({1, 7, 19, 111, 600, 4500})});
  // One long sequence: many splits and the reduction kernel.
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, decode_seqs({20000})});
  run_attention_case(cuda, cpu, ++seed,
                     {32, 8, 128, 128, 16, decode_seqs({3000, 17}), -1, 0.0f, 4.0f});
}

TEST(AttentionDecode, ManySequences) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4100;
  Rng rng(seed);
  std::vector<Seq> seqs;
  for (int i = 0; i < 64; ++i) seqs.push_back({1, static_cast<int32_t>(1 + rng.below(2000))});
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, seqs});
}

TEST(AttentionDecode, HeadLayoutsAndDims) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4200;
  const auto seqs = decode_seqs({5, 33, 700});
  run_attention_case(cuda, cpu, ++seed, {16, 1, 64, 64, 16, seqs});    // MQA
  run_attention_case(cuda, cpu, ++seed, {32, 1, 128, 128, 16, seqs});  // MQA, group 32
  run_attention_case(cuda, cpu, ++seed, {8, 8, 256, 256, 16, seqs});   // MHA, head_dim 256
  run_attention_case(cuda, cpu, ++seed, {12, 4, 80, 80, 16, seqs});    // generic head_dim 80
  run_attention_case(cuda, cpu, ++seed, {8, 2, 128, 64, 32, seqs});    // Dv != D, block 32
  run_attention_case(cuda, cpu, ++seed, {8, 2, 64, 64, 8, seqs});      // block 8
}

TEST(AttentionDecode, SlidingWindowAndSoftcap) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4300;
  const auto seqs = decode_seqs({1, 20, 33, 500, 5000});
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, seqs, 32});
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, seqs, 4096});
  run_attention_case(cuda, cpu, ++seed, {8, 4, 256, 256, 16, seqs, -1, 30.0f, 8.0f});
  run_attention_case(cuda, cpu, ++seed, {8, 4, 128, 128, 16, seqs, 100, 5.0f, 8.0f});
}

TEST(AttentionPrefill, RaggedWithCachedPrefixes) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4400;
  // fresh prefill | chunk after a cached prefix | a decode in the batch | short prompt |
  // a sequence with no query this step
  const std::vector<Seq> mixed = {{111, 111}, {19, 19 + 64}, {1, 37}, {7, 7}, {0, 50}, {33, 100}};
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, mixed});
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, {{1, 1}, {7, 7}, {19, 19}}});
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, {{500, 1200}}, -1, 0.0f, 4.0f});
  run_attention_case(cuda, cpu, ++seed, {16, 1, 64, 64, 16, mixed});   // MQA
  run_attention_case(cuda, cpu, ++seed, {8, 8, 256, 256, 32, mixed});  // MHA, head_dim 256
  run_attention_case(cuda, cpu, ++seed, {12, 4, 80, 80, 8, mixed});    // generic head_dim 80
  run_attention_case(cuda, cpu, ++seed, {8, 2, 128, 64, 16, mixed});   // Dv != D
}

TEST(AttentionPrefill, SlidingWindowAndSoftcap) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4500;
  const std::vector<Seq> seqs = {{111, 111}, {40, 300}, {1, 90}, {64, 64}};
  for (int32_t window : {1, 16, 37, 100})
    run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, seqs, window});
  run_attention_case(cuda, cpu, ++seed, {8, 4, 128, 128, 16, seqs, -1, 20.0f, 8.0f});
  run_attention_case(cuda, cpu, ++seed, {8, 4, 128, 128, 16, seqs, 50, 20.0f, 8.0f});
}

}  // namespace
}  // namespace pagellm::optest
