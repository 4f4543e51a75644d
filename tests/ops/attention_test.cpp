// Paged attention against the CPU reference: decode batches (split-KV and its reduction, large
// batches of mixed lengths, graph batches with padding planned for a bound), ragged
// prefill with cached prefixes, mixed batches, GQA 32:8, MQA, MHA, head dims 64/80/128/256 and
// the MLA split 192/128, sliding windows, soft-capping, block sizes 1/7/8/16/32, shuffled
// (non-consecutive) block tables with padded rows, sequences that have no query in the step, and
// long prompts (2K-3K tokens) on the tensor-core prefill kernel.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_test_util.h"
#include "paged_batch.h"

namespace pagellm::optest {
namespace {

struct AttnCase {
  int64_t hq, hkv, d, dv;
  int32_t block_size;
  std::vector<Seq> seqs;
  int32_t window = -1;
  float softcap = 0.0f;
  float q_amp = 1.0f;      // larger makes the softmax peakier
  int32_t n_padding = 0;   // graph-batch padding sequences after the real ones: 1 query, no context
  bool via_graph = false;  // also record the call in a CUDA graph and replay it
  int32_t kv_bound = 0;    // > 0: meta.max_seqlen_kv (a graph's bound, past every context)
};

// Prefill runs P.V on tensor cores with the softmax weights P rounded to bf16 (fp32
// accumulation): weight j of a row carries a relative error e_j, |e_j| <= 2^-8, which moves output
// element c by sum_j p_j e_j v_jc / l (l = sum_j p_j, summed unrounded). Round-to-nearest errors of
// random inputs are modelled as independent and zero-mean; Hoeffding's inequality then bounds that
// sum by sqrt(2 ln(2 / 1e-12)) = 7.5 times 2^-8 sqrt(sum_j (p_j v_jc)^2) / l, except with
// probability 1e-12 per element. That bound is the per-element slack on top of kBf16Tol. It
// shrinks like 1/sqrt(keys) on long contexts, as the output does, where a worst-case bound
// (2^-8 sum_j p_j |v_jc| / l) would not and would hide a lost key tile.
constexpr double kPRoundingSigmas = 7.5;

std::vector<float> p_rounding_slack(const AttnCase& c, const std::vector<float>& q,
                                    const std::vector<float>& kc, const std::vector<float>& vc,
                                    const std::vector<int32_t>& cu, const std::vector<int32_t>& lens,
                                    const std::vector<int32_t>& table, int64_t table_ld, float scale) {
  const int64_t group = c.hq / c.hkv, bs = c.block_size;
  std::vector<float> slack(static_cast<size_t>(cu.back()) * c.hq * c.dv, 0.0f);
  std::vector<double> p, acc2(c.dv);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int32_t n_q = cu[s + 1] - cu[s];
    for (int32_t i = 0; i < n_q; ++i) {
      const int64_t tok = cu[s] + i;
      const int32_t pos = lens[s] - n_q + i;
      const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t kh = h / group;
        const float* qv = q.data() + (tok * c.hq + h) * c.d;
        const auto row = [&](int32_t t) { return table[s * table_ld + t / bs] * bs + t % bs; };
        p.assign(pos - lo + 1, 0.0);
        double mx = -INFINITY;
        for (int32_t t = lo; t <= pos; ++t) {
          const float* kv = kc.data() + (row(t) * c.hkv + kh) * c.d;
          double part[4] = {0.0, 0.0, 0.0, 0.0};  // independent sums: 4x shorter dependency chain
          for (int64_t e = 0; e < c.d; ++e) part[e % 4] += static_cast<double>(qv[e]) * kv[e];
          double sc = (part[0] + part[1] + part[2] + part[3]) * scale;
          if (c.softcap > 0.0f) sc = c.softcap * std::tanh(sc / c.softcap);
          p[t - lo] = sc;
          mx = std::max(mx, sc);
        }
        double l = 0.0;
        std::fill(acc2.begin(), acc2.end(), 0.0);
        for (int32_t t = lo; t <= pos; ++t) {
          const double pj = std::exp(p[t - lo] - mx);
          l += pj;
          const float* vv = vc.data() + (row(t) * c.hkv + kh) * c.dv;
          for (int64_t e = 0; e < c.dv; ++e) acc2[e] += (pj * vv[e]) * (pj * vv[e]);
        }
        float* out = slack.data() + (tok * c.hq + h) * c.dv;
        for (int64_t e = 0; e < c.dv; ++e)
          out[e] = static_cast<float>(kPRoundingSigmas * std::ldexp(1.0, -8) * std::sqrt(acc2[e]) / l);
      }
    }
  }
  return slack;
}

void run_attention_case(Backend& cuda, Backend& cpu, uint64_t seed, const AttnCase& c) {
  Rng rng(seed);
  const int32_t bs = c.block_size;
  PagedBatch pb = paged_batch(rng, c.seqs, c.n_padding, bs);
  const int32_t n_seqs = pb.n_seqs, max_q = pb.max_q, max_kv = pb.max_kv;
  const int64_t n = pb.n, n_real_tokens = pb.n_real_tokens, pool = pb.pool, table_ld = pb.table_ld;
  const std::vector<int32_t>&cu = pb.cu, &lens = pb.lens, &table = pb.table;

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
  meta.max_seqlen_kv = std::max({max_kv, max_q, c.kv_bound});
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  params.window = c.window;
  params.softcap = c.softcap;
  Tensor out_t = out.view(DType::kBF16, {n, c.hq, c.dv});
  const Tensor q_t = q_dev->view(DType::kBF16, {n, c.hq, c.d});
  const Tensor k_t = kc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.d});
  const Tensor v_t = vc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.dv});
  cuda.attention(q_t, k_t, v_t, meta, params, out_t);

  // The reference over the real sequences only.
  const AttentionMeta hmeta = real_host_meta(pb, meta);
  std::vector<float> want(n_real_tokens * c.hq * c.dv);
  Tensor want_t = host_f32(want, {n_real_tokens, c.hq, c.dv});
  std::vector<float> q_real(q.begin(), q.begin() + n_real_tokens * c.hq * c.d);
  cpu.attention(host_f32(q_real, {n_real_tokens, c.hq, c.d}), host_f32(kc, {pool, bs, c.hkv, c.d}),
                host_f32(vc, {pool, bs, c.hkv, c.dv}), hmeta, params, want_t);

  std::ostringstream seqs;
  for (const Seq& s : c.seqs) seqs << s.n_q << "/" << s.kv_len << ",";
  const std::string what = Label("attention", seed)("hq", c.hq)("hkv", c.hkv)("d", c.d)("dv", c.dv)(
      "block_size", bs)("window", c.window)("softcap", c.softcap)("q_amp", c.q_amp)(
      "padding", c.n_padding)("kv_bound", c.kv_bound)("path", max_q == 1 ? "decode" : "prefill")(
      "seqs(n_q/kv)", seqs.str());
  std::vector<float> got = download_bf16(out);
  got.resize(n * c.hq * c.dv);
  std::vector<float> got_real(got.begin(), got.begin() + want.size());
  if (max_q > 1) {
    const std::vector<float> slack =
        p_rounding_slack(c, q, kc, vc, cu, lens, table, table_ld, params.scale);
    EXPECT_TRUE(compare(what, got_real, want, kBf16Tol, &slack));
  } else {
    EXPECT_TRUE(compare(what, got_real, want, kBf16Tol));
  }
  EXPECT_TRUE(padding_outputs_zero(what, got, want.size()));
  EXPECT_TRUE(guards_ok(what, out));
  // Recorded after the direct run above (which sized the workspace), replayed: the same values.
  if (c.via_graph)
    expect_graph_replay_matches(
        cuda, what, [&] { cuda.attention(q_t, k_t, v_t, meta, params, out_t); }, out, got);
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
  run_attention_case(cuda, cpu, ++seed, {8, 2, 36, 36, 16, seqs});     // rows not 16-byte aligned
  run_attention_case(cuda, cpu, ++seed, {8, 2, 128, 128, 1, seqs});    // block size 1
  run_attention_case(cuda, cpu, ++seed, {8, 2, 128, 128, 7, seqs});  // block size not a power of 2
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

// Batches of more (sequence, KV head) pairs than SMs, mixed lengths, sequences without a query.
TEST(AttentionDecode, LargeBatches) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4700;
  Rng rng(seed);
  auto random_seqs = [&](int count, int32_t max_len, bool some_without_query) {
    std::vector<Seq> seqs;
    for (int i = 0; i < count; ++i) {
      const int32_t n_q = some_without_query && i % 7 == 3 ? 0 : 1;
      seqs.push_back({n_q, static_cast<int32_t>(1 + rng.below(max_len))});
    }
    return seqs;
  };
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, random_seqs(200, 1500, true)});
  run_attention_case(cuda, cpu, ++seed,
                     {32, 8, 128, 128, 16, random_seqs(150, 800, false), 100, 5.0f, 4.0f});
  run_attention_case(cuda, cpu, ++seed, {8, 8, 256, 256, 16, random_seqs(20, 3000, true)});
  run_attention_case(cuda, cpu, ++seed, {16, 2, 128, 128, 7, random_seqs(70, 900, false)});
  run_attention_case(cuda, cpu, ++seed, {8, 2, 36, 36, 1, random_seqs(80, 300, true)});
  run_attention_case(cuda, cpu, ++seed, {12, 4, 80, 80, 16, random_seqs(40, 2000, false)});
  // Equal lengths: every item cut at the same offsets.
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 16, std::vector<Seq>(256, Seq{1, 640})});
}

TEST(AttentionDecode, GraphBatchesAndPadding) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4800;
  // A batch of 3 padded to 8 (padding: one query, no context), planned for its longest context
  // and for a graph's bound far past it; then a large batch the same ways.
  for (const int32_t bound : {0, 8192}) {
    AttnCase small{32, 8, 128, 128, 16, decode_seqs({1, 77, 300})};
    small.n_padding = 5;
    small.via_graph = true;
    small.kv_bound = bound;
    run_attention_case(cuda, cpu, ++seed, small);
    std::vector<Seq> seqs;
    for (int i = 0; i < 150; ++i) seqs.push_back({1, 1 + (i * 37) % 700});
    AttnCase large{32, 8, 128, 128, 16, seqs};
    large.n_padding = 10;
    large.via_graph = true;
    large.kv_bound = bound;
    run_attention_case(cuda, cpu, ++seed, large);
  }
}

// Merged splits, padding and a graph over 20 sequences of short contexts, then one long context
// whose pieces outnumber its blocks: small enough for the sanitizers of scripts/gpu-check.sh.
TEST(AttentionDecode, MergedSplitsWithPadding) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4900;
  AttnCase c{32,
             8,
             128,
             128,
             16,
             decode_seqs({1,  5, 300, 64, 17, 33, 250, 2, 129, 16,
                          90, 7, 200, 31, 1,  65, 100, 3, 48,  160})};
  c.n_padding = 2;
  c.via_graph = true;
  run_attention_case(cuda, cpu, ++seed, c);
  c.kv_bound = 4096;
  run_attention_case(cuda, cpu, ++seed, c);
  // A long context among them, planned for a long bound: 32 pieces of 1,024 keys a (sequence, KV
  // head) planned, 4 blocks each (the grid does not grow with the bound), so the 6,000-key
  // context's 6 pieces are walked two to a block and merged across blocks and walks.
  AttnCase walk = c;
  walk.seqs.push_back(Seq{1, 6000});
  walk.kv_bound = 32768;
  run_attention_case(cuda, cpu, ++seed, walk);
}

// Batch-1 and small-batch decode as the models run it, whose splits merge within a thread-block
// cluster on sm_90 (2 to 16 blocks: Llama-3-8B's 12 at 768 keys, Llama-2-7B's 8), with pieces
// past a short context left empty, replayed from graphs planned for a bound. gpu-check also runs
// every decode test with PAGELLM_DECODE_CLUSTER=0 (the global merge) and 8 (portable sizes only).
TEST(AttentionDecode, ClusteredSplits) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 5000;
  const auto graph_case = [](AttnCase c, int32_t bound) {
    c.via_graph = true;
    c.kv_bound = bound;
    return c;
  };
  for (const int32_t len : {513, 768, 70, 2})  // Llama-3-8B, planned for 768 keys
    run_attention_case(cuda, cpu, ++seed,
                       graph_case({32, 8, 128, 128, 16, decode_seqs({len})}, 768));
  run_attention_case(cuda, cpu, ++seed,
                     graph_case({32, 32, 128, 128, 16, decode_seqs({640})}, 768));  // Llama-2-7B
  run_attention_case(cuda, cpu, ++seed, {64, 8, 128, 128, 16, decode_seqs({1000, 300})});
  run_attention_case(cuda, cpu, ++seed, {12, 4, 80, 80, 7, decode_seqs({900, 5, 64})});
  run_attention_case(cuda, cpu, ++seed,
                     {32, 8, 128, 128, 16, decode_seqs({400, 3, 777, 129}), 200, 20.0f, 4.0f});
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
  run_attention_case(cuda, cpu, ++seed, {16, 16, 192, 128, 16, mixed});  // MLA expanded: 192/128
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 1, mixed});   // block size 1
  run_attention_case(cuda, cpu, ++seed, {32, 8, 128, 128, 7, mixed});   // block size 7
  run_attention_case(cuda, cpu, ++seed, {8, 1, 64, 64, 7, mixed, 20});  // block 7, window
  // head_dim 36 is not a multiple of 8: the CUDA-core fallback kernel.
  run_attention_case(cuda, cpu, ++seed, {8, 2, 36, 36, 16, mixed});
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

// Long prompts: many key tiles per query tile, the online softmax rescaling across them, tiles
// of (token, head) rows that end mid-sequence, and both grid orders (paired tiles, and
// heaviest-first for sequences of more than 128 tiles).
TEST(AttentionPrefill, LongPrompts) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 4600;
  // One fresh 2048-token prompt, GQA 4:1 (16 tokens per tile of 64 rows).
  run_attention_case(cuda, cpu, ++seed, {4, 1, 128, 128, 16, {{2048, 2048}}});
  // Peaky softmax: the running max moves late, so early tiles are rescaled by tiny factors.
  run_attention_case(cuda, cpu, ++seed, {2, 1, 128, 128, 16, {{2048, 2048}}, -1, 0.0f, 6.0f});
  // Several sequences of different lengths, cached prefixes, a decode token, a sequence without
  // queries, GQA 8:1, block size 7 (no block boundary on a tile boundary).
  const std::vector<Seq> ragged = {{1000, 1000}, {700, 2100}, {333, 1333}, {64, 3000},
                                   {1, 2500},    {0, 900},    {250, 261}};
  run_attention_case(cuda, cpu, ++seed, {8, 1, 128, 128, 7, ragged});
  // MHA with a sliding window and soft-capping over a cached prefix.
  run_attention_case(cuda, cpu, ++seed,
                     {2, 2, 128, 128, 16, {{2048, 2560}, {300, 300}}, 700, 30.0f, 8.0f});
  // GQA 32:1: 300 tokens are 9600 rows, 150 tiles, past the longest sequence whose tiles are
  // paired in one block: the unpaired, heaviest-first grid.
  run_attention_case(cuda, cpu, ++seed, {32, 1, 64, 64, 16, {{300, 400}, {5, 5}}});
  // head_dim 256 and the MLA split 192/128.
  run_attention_case(cuda, cpu, ++seed, {2, 1, 256, 256, 16, {{1024, 1536}, {77, 77}}});
  run_attention_case(cuda, cpu, ++seed, {2, 2, 192, 128, 16, {{1500, 1500}, {200, 1200}}});
}

}  // namespace
}  // namespace pagellm::optest
