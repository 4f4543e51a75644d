// Latent attention (attention_mla.cu) against the CPU reference's attention on the same latent
// layout: one KV head of 576 values per token (k_pe | c_kv) whose 512 c_kv columns are also V (the
// V tensor is a column view of the K cache rows), 16 (DeepSeek-V2-Lite) and 128 (V3) query heads,
// decode batches (split-KV and the merge of the splits) and ragged prefill (cached prefixes, a
// decode token in the batch, sequences without queries), contexts of 1 to 300 tokens, block
// sizes 16 and 7 over shuffled block tables; V at the front of the row, the golden fixtures' tiny
// layout, separate V rows of head dims above 256 with GQA, a partial tile of heads, a sliding
// window with soft-capping, a peaky softmax, padding sequences of graph batches, launches planned
// for a context bound far past the real ones (empty splits), and a replay from a CUDA graph;
// attention_project (the merge with each head's product after it) on the decode batches.
//
// Both kernels run: the tensor-core one takes the 576/512 latent cases (V at column 64 or 0, 16,
// 20 and 128 heads), the CUDA-core one the golden fixtures' tiny layout and separate V rows.
//
// Tolerance: kBf16Tol. Both kernels keep scores, softmax weights and the P.V sums in fp32 (the
// tensor-core kernel multiplies V by P as two bf16 terms, hi + lo, so P carries 2^-17 relative
// error rather than bf16's 2^-9), so against the fp32/fp64 reference only the bf16 rounding of
// the output (2^-9 relative) and fp32 summation order differ.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_test_util.h"
#include "paged_batch.h"

namespace pagellm::optest {
namespace {

struct MlaCase {
  int64_t hq, hkv;
  int64_t d, dv;
  int64_t v_offset;  // V's first column inside the K row; -1: a separate V cache
  int32_t block_size;
  std::vector<Seq> seqs;
  int32_t window = -1;
  float softcap = 0.0f;
  float q_amp = 1.0f;      // larger makes the softmax peakier
  int32_t n_padding = 0;   // graph-batch padding sequences after the real ones: 1 query, no context
  bool via_graph = false;  // also record the call in a CUDA graph and replay it
  int32_t kv_bound = 0;    // > 0: meta.max_seqlen_kv (a graph's bound, past every context)
  int32_t project_m = 0;   // > 0: also attention_project with a [hq, project_m, dv] matrix
};

constexpr int64_t kV2LiteDim = 576, kV2LiteDimV = 512, kRopeDim = 64;

// attention_project on the case's batch: at decode sizes the merge of the splits applies each
// head's matrix (mla_merge_project_kernel), elsewhere attention() then batched_matmul() run. The
// reference multiplies the GPU's own attention output (`attn`, bf16 values, checked against the
// CPU above) by the same matrix on the CPU, so only the product's fp32 summation order and its
// bf16 rounding differ (kBf16Tol): the fused merge must round each latent value exactly as the
// merge kernel does. w is a strided view as W_UV is of kv_b_proj's rows (each head's rows
// kProjSkip rows into its block); padding tokens' outputs are zeros.
void check_projection(Backend& cuda, Backend& cpu, Rng& rng, const MlaCase& c,
                      const std::string& what, const Tensor& q_t, const Tensor& k_t,
                      const Tensor& v_t, const AttentionMeta& meta, const AttentionParams& params,
                      std::vector<float> attn) {
  constexpr int64_t kProjSkip = 16;
  const int64_t n = q_t.size(0), m = c.project_m, w_rows = kProjSkip + m;
  std::vector<float> w = random_bf16_values(rng, c.hq * w_rows * c.dv);
  auto w_dev = upload_bf16(cuda, w);
  Tensor w_t = w_dev->view(DType::kBF16, {c.hq, w_rows, c.dv});
  w_t.data = static_cast<char*>(w_t.data) + kProjSkip * c.dv * 2;
  w_t.shape[1] = m;
  DevBuf scratch(cuda, std::max<int64_t>(n, 1) * c.hq * c.dv * 2);
  DevBuf out(cuda, std::max<int64_t>(n, 1) * c.hq * m * 2);
  Tensor attn_t = scratch.view(DType::kBF16, {n, c.hq, c.dv});
  Tensor out_t = out.view(DType::kBF16, {n, c.hq, m});
  const auto call = [&] {
    cuda.attention_project(q_t, k_t, v_t, meta, params, w_t, attn_t, out_t);
  };
  call();

  attn.resize(n * c.hq * c.dv);
  std::vector<float> want(n * c.hq * m);
  Tensor want_heads = host_f32(want, {n, c.hq, m}).transpose01();
  Tensor w_host = host_f32(w, {c.hq, w_rows, c.dv});
  w_host.data = w.data() + kProjSkip * c.dv;
  w_host.shape[1] = m;
  cpu.batched_matmul(host_f32(attn, {n, c.hq, c.dv}).transpose01(), w_host, want_heads);
  const std::string pwhat = what + " attention_project m=" + std::to_string(m);
  std::vector<float> got = download_bf16(out);
  got.resize(n * c.hq * m);
  EXPECT_TRUE(compare(pwhat, got, want, kBf16Tol));
  EXPECT_TRUE(guards_ok(pwhat, out));
  if (c.via_graph) expect_graph_replay_matches(cuda, pwhat, call, out, got);
}

void run_mla_case(Backend& cuda, Backend& cpu, uint64_t seed, const MlaCase& c) {
  Rng rng(seed);
  const int32_t bs = c.block_size;
  PagedBatch pb = paged_batch(rng, c.seqs, c.n_padding, bs);
  const int32_t n_seqs = pb.n_seqs, max_q = pb.max_q, max_kv = pb.max_kv;
  const int64_t n = pb.n, n_real_tokens = pb.n_real_tokens, pool = pb.pool, table_ld = pb.table_ld;
  const std::vector<int32_t>&cu = pb.cu, &lens = pb.lens, &table = pb.table;

  const bool latent = c.v_offset >= 0;
  std::vector<float> q = random_bf16_values(rng, n * c.hq * c.d, c.q_amp);
  std::vector<float> kc = random_bf16_values(rng, pool * bs * c.hkv * c.d);
  std::vector<float> vc =
      latent ? std::vector<float>() : random_bf16_values(rng, pool * bs * c.hkv * c.dv);

  auto q_dev = upload_bf16(cuda, q), kc_dev = upload_bf16(cuda, kc);
  auto vc_dev = latent ? nullptr : upload_bf16(cuda, vc);
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
  Tensor k_t = kc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.d});
  Tensor v_t = latent ? k_t.slice_cols(c.v_offset, c.v_offset + c.dv)
                      : vc_dev->view(DType::kBF16, {pool, bs, c.hkv, c.dv});
  Tensor q_t = q_dev->view(DType::kBF16, {n, c.hq, c.d});
  Tensor out_t = out.view(DType::kBF16, {n, c.hq, c.dv});
  cuda.attention(q_t, k_t, v_t, meta, params, out_t);

  // The reference over the real sequences only.
  const AttentionMeta hmeta = real_host_meta(pb, meta);
  std::vector<float> want(n_real_tokens * c.hq * c.dv);
  Tensor want_t = host_f32(want, {n_real_tokens, c.hq, c.dv});
  Tensor hk = host_f32(kc, {pool, bs, c.hkv, c.d});
  Tensor hv =
      latent ? hk.slice_cols(c.v_offset, c.v_offset + c.dv) : host_f32(vc, {pool, bs, c.hkv, c.dv});
  std::vector<float> q_real(q.begin(), q.begin() + n_real_tokens * c.hq * c.d);
  cpu.attention(host_f32(q_real, {n_real_tokens, c.hq, c.d}), hk, hv, hmeta, params, want_t);

  std::ostringstream seqs;
  for (const Seq& s : c.seqs) seqs << s.n_q << "/" << s.kv_len << ",";
  const std::string what = Label("attention_mla", seed)("hq", c.hq)("hkv", c.hkv)("d", c.d)(
      "dv", c.dv)("v_offset", c.v_offset)("block_size", bs)("window", c.window)(
      "softcap", c.softcap)("q_amp", c.q_amp)("padding", c.n_padding)("kv_bound", c.kv_bound)(
      "path", max_q == 1 ? "decode" : "prefill")("seqs(n_q/kv)", seqs.str());
  std::vector<float> got = download_bf16(out);
  got.resize(n * c.hq * c.dv);
  std::vector<float> got_real(got.begin(), got.begin() + n_real_tokens * c.hq * c.dv);
  EXPECT_TRUE(compare(what, got_real, want, kBf16Tol));
  EXPECT_TRUE(padding_outputs_zero(what, got, n_real_tokens * c.hq * c.dv));
  EXPECT_TRUE(guards_ok(what, out));
  // Recorded after the direct run above (which sized the workspace), replayed: the same values.
  if (c.via_graph)
    expect_graph_replay_matches(
        cuda, what, [&] { cuda.attention(q_t, k_t, v_t, meta, params, out_t); }, out, got);
  if (c.project_m > 0) check_projection(cuda, cpu, rng, c, what, q_t, k_t, v_t, meta, params, got);
}

TEST(AttentionMla, DecodeV2Lite) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8000;
  const int64_t D = kV2LiteDim, Dv = kV2LiteDimV, P = kRopeDim;
  for (int32_t bs : {16, 7}) {
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, decode_seqs({1})});
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, decode_seqs({1, 7, 19, 111, 300})});
    // One sequence: the context cut in splits (ten of one key tile at 300 tokens), then merged.
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, decode_seqs({300})});
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, decode_seqs({33})});
  }
  // Peaky softmax: the running max moves late, rescaling earlier keys by tiny factors.
  run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, 16, decode_seqs({300, 5}), -1, 0.0f, 6.0f});
  // Many sequences: more blocks than two per SM, one split each.
  Rng rng(seed);
  std::vector<Seq> many;
  for (int i = 0; i < 40; ++i) many.push_back({1, static_cast<int32_t>(1 + rng.below(300))});
  run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, 16, many});
}

TEST(AttentionMla, DecodeV3Heads) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8100;
  const int64_t D = kV2LiteDim, Dv = kV2LiteDimV, P = kRopeDim;
  for (int32_t bs : {16, 7}) {
    run_mla_case(cuda, cpu, ++seed, {128, 1, D, Dv, P, bs, decode_seqs({1, 33, 300})});
    run_mla_case(cuda, cpu, ++seed, {128, 1, D, Dv, P, bs, decode_seqs({257})});
  }
}

TEST(AttentionMla, PrefillRagged) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8200;
  const int64_t D = kV2LiteDim, Dv = kV2LiteDimV, P = kRopeDim;
  // fresh prefill | chunk after a cached prefix | a decode in the batch | short prompt |
  // a sequence with no query this step | chunk after a prefix | a few queries on a long context
  const std::vector<Seq> mixed = {{111, 111}, {19, 19 + 64}, {1, 37}, {7, 7},
                                  {0, 50},    {33, 100},     {3, 300}};
  for (int32_t bs : {16, 7}) {
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, mixed});
    run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, bs, {{300, 300}}});
  }
  // A short chunk on a long context: few blocks, so the context is split for every query.
  run_mla_case(cuda, cpu, ++seed, {16, 1, D, Dv, P, 16, {{5, 300}, {2, 2}}});
  run_mla_case(cuda, cpu, ++seed, {128, 1, D, Dv, P, 16, {{19, 19}, {1, 200}, {0, 9}, {40, 140}}});
  run_mla_case(cuda, cpu, ++seed, {128, 1, D, Dv, P, 7, {{4, 300}}});
}

TEST(AttentionMla, LayoutsAndOptions) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8300;
  const std::vector<Seq> mixed = {{23, 23}, {1, 150}, {9, 60}, {0, 20}};
  const auto seqs = decode_seqs({1, 20, 299});
  // V in the first 512 columns, k_pe after it.
  run_mla_case(cuda, cpu, ++seed, {16, 1, kV2LiteDim, kV2LiteDimV, 0, 16, seqs});
  run_mla_case(cuda, cpu, ++seed, {16, 1, kV2LiteDim, kV2LiteDimV, 0, 16, mixed});
  // The golden fixtures' layout: 4 heads, k_pe 8 | c_kv 32.
  run_mla_case(cuda, cpu, ++seed, {4, 1, 40, 32, 8, 16, seqs});
  run_mla_case(cuda, cpu, ++seed, {4, 1, 40, 32, 8, 7, mixed});
  // 20 heads: a full tile of 16 and a partial one of 4.
  run_mla_case(cuda, cpu, ++seed, {20, 1, kV2LiteDim, kV2LiteDimV, kRopeDim, 16, seqs});
  // Head dims above 256 with separate V rows, GQA 4:1 over 2 KV heads.
  run_mla_case(cuda, cpu, ++seed, {8, 2, 320, 288, -1, 16, seqs});
  run_mla_case(cuda, cpu, ++seed, {8, 2, 320, 288, -1, 7, mixed});
  // Sliding window and soft-capping.
  run_mla_case(cuda, cpu, ++seed,
               {16, 1, kV2LiteDim, kV2LiteDimV, kRopeDim, 16, seqs, 64, 30.0f, 8.0f});
  run_mla_case(cuda, cpu, ++seed,
               {16, 1, kV2LiteDim, kV2LiteDimV, kRopeDim, 7, mixed, 37, 20.0f, 4.0f});
}

TEST(AttentionMla, GraphBatchesAndPadding) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8400;
  const int64_t D = kV2LiteDim, Dv = kV2LiteDimV, P = kRopeDim;
  // A decode batch of 3 padded to 8 (padding: one query, no context), split and unsplit.
  MlaCase c{16, 1, D, Dv, P, 16, decode_seqs({1, 77, 300})};
  c.n_padding = 5;
  c.via_graph = true;
  run_mla_case(cuda, cpu, ++seed, c);
  MlaCase one{16, 1, D, Dv, P, 16, decode_seqs({300})};
  one.n_padding = 1;
  one.via_graph = true;
  run_mla_case(cuda, cpu, ++seed, one);
  MlaCase wide{128, 1, D, Dv, P, 16, decode_seqs({5, 150, 290, 12})};
  wide.via_graph = true;
  run_mla_case(cuda, cpu, ++seed, wide);
  // Planned for a bound far past every context (a graph recorded for DeepSeek-V2-Lite's 163,840
  // positions): the splits the SMs want (66 on an H200's 132), most of them empty here.
  for (int32_t bs : {16, 7}) {
    MlaCase bound{16, 1, D, Dv, P, bs, decode_seqs({1, 40, 300})};
    bound.n_padding = 1;
    bound.via_graph = true;
    bound.kv_bound = 163840;
    run_mla_case(cuda, cpu, ++seed, bound);
  }
}

TEST(AttentionMla, ProjectedMerge) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 8500;
  const int64_t D = kV2LiteDim, Dv = kV2LiteDimV, P = kRopeDim;
  const auto projected = [](MlaCase c, int32_t m) {
    c.project_m = m;
    return c;
  };
  // Decode steps the merge takes the product into: one token (V2-Lite's W_UV, 128 rows), five,
  // a row count off the block's 32, V3's 128 heads, V in the first 512 columns.
  for (int32_t bs : {16, 7}) {
    run_mla_case(cuda, cpu, ++seed, projected({16, 1, D, Dv, P, bs, decode_seqs({300})}, 128));
    run_mla_case(cuda, cpu, ++seed,
                 projected({16, 1, D, Dv, P, bs, decode_seqs({1, 7, 19, 111, 300})}, 128));
  }
  run_mla_case(cuda, cpu, ++seed, projected({16, 1, D, Dv, P, 16, decode_seqs({33})}, 40));
  run_mla_case(cuda, cpu, ++seed,
               projected({128, 1, D, Dv, P, 16, decode_seqs({1, 33, 300})}, 128));
  run_mla_case(cuda, cpu, ++seed, projected({16, 1, D, Dv, 0, 16, decode_seqs({1, 20, 299})}, 128));
  // head_dim_v of 256 (separate V rows, GQA 4:1) and 1024 (the CUDA-core kernel).
  run_mla_case(cuda, cpu, ++seed, projected({8, 2, 320, 256, -1, 16, decode_seqs({1, 150})}, 72));
  run_mla_case(cuda, cpu, ++seed, projected({4, 1, 1088, 1024, 64, 16, decode_seqs({100})}, 64));
  // Graph batches: padding tokens (zeros out), a bound far past every context (empty splits).
  MlaCase padded = projected({16, 1, D, Dv, P, 16, decode_seqs({1, 77, 300})}, 128);
  padded.n_padding = 5;
  padded.via_graph = true;
  run_mla_case(cuda, cpu, ++seed, padded);
  MlaCase bound = projected({16, 1, D, Dv, P, 7, decode_seqs({1, 40, 300})}, 128);
  bound.n_padding = 1;
  bound.via_graph = true;
  bound.kv_bound = 163840;
  run_mla_case(cuda, cpu, ++seed, bound);
  // Where the merge does not take it: more tokens than its 8 (kProjectMaxTokens), prefill,
  // the golden fixtures' 32-dim V.
  Rng rng(seed);
  std::vector<Seq> many;
  for (int i = 0; i < 12; ++i) many.push_back({1, static_cast<int32_t>(1 + rng.below(300))});
  run_mla_case(cuda, cpu, ++seed, projected({16, 1, D, Dv, P, 16, many}, 128));
  run_mla_case(cuda, cpu, ++seed, projected({16, 1, D, Dv, P, 16, {{23, 23}, {1, 150}}}, 128));
  run_mla_case(cuda, cpu, ++seed, projected({4, 1, 40, 32, 8, 16, decode_seqs({1, 20})}, 16));
}

}  // namespace
}  // namespace pagellm::optest
