// The streamed chain of one-row products (launch_gemv_stream_chain, gemv_stream.cu).
//
// Each kind of phase alone against a host reference: plain, + residual, RMS-normalized input,
// RMS-normalized input with SwiGLU, on shapes whose outputs do and do not divide among the
// launch's blocks (fewer outputs than blocks included) and on Llama-3-8B's and DeepSeek-V2-Lite's
// widths. Then a chain of several layers in one launch against the same phases launched one at a
// time, bit for bit: each block makes the same outputs in the same order either way, so any
// difference is a phase that read its input before the phase before had written all of it, or a
// stage of weights taken before it landed. The launch is repeated on the counter it leaves.
//
// Tolerance: the output is rounded to bf16 once (kBf16Tol). The normalized input is rounded to
// bf16 by both, from a sum of squares added in another order; where the two roundings of an input
// differ, an output moves by about 2^-9 of sqrt(sum_k (x_k w_mk)^2), so each output gets 2^-6 of
// that as slack (as in fused_projection_test.cpp), and SwiGLU carries it through silu(g) * u.
#include <algorithm>
#include <cmath>

#include "op_test_util.h"
#include "paged_batch.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::optest {
namespace {

using cuda::GemvEpilogue;

struct PhaseCase {
  int m, k;
  GemvEpilogue epilogue;
  bool norm;
};

// The reference of one phase: outputs and slack, from the host values of x, w, the norm weight
// and (kAdd) the residual in out.
void reference(const PhaseCase& c, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& norm_w, const std::vector<float>& out_before,
               std::vector<float>& want, std::vector<float>& slack) {
  std::vector<float> xin = x;
  if (c.norm) {
    double ss = 0.0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const float rstd = static_cast<float>(1.0 / std::sqrt(ss / c.k + 1e-5));
    for (int i = 0; i < c.k; ++i) xin[i] = round_bf16(x[i] * rstd * norm_w[i]);
  }
  const int rows = c.m;
  std::vector<double> y(rows), mag(rows);
  for (int r = 0; r < rows; ++r) {
    double s = 0.0, s2 = 0.0;
    for (int i = 0; i < c.k; ++i) {
      const double t = static_cast<double>(xin[i]) * w[static_cast<size_t>(r) * c.k + i];
      s += t;
      s2 += t * t;
    }
    y[r] = s;
    mag[r] = c.norm ? std::sqrt(s2) * std::ldexp(1.0, -6) : 0.0;
  }
  const int outputs = c.epilogue == GemvEpilogue::kSwiGlu ? rows / 2 : rows;
  want.assign(outputs, 0.0f);
  slack.assign(outputs, 0.0f);
  for (int o = 0; o < outputs; ++o) {
    if (c.epilogue == GemvEpilogue::kSwiGlu) {
      const double g = y[o], u = y[outputs + o];
      const double sg = 1.0 / (1.0 + std::exp(-g));
      want[o] = static_cast<float>(g * sg * u);
      // d/dg (g sg u) = u sg (1 + g (1 - sg)); d/du = g sg.
      const double dg = std::fabs(u * sg * (1.0 + g * (1.0 - sg))), du = std::fabs(g * sg);
      slack[o] = static_cast<float>(dg * mag[o] + du * mag[outputs + o]);
    } else {
      want[o] = static_cast<float>(y[o] + (c.epilogue == GemvEpilogue::kAdd ? out_before[o] : 0.0));
      slack[o] = static_cast<float>(mag[o]);
    }
  }
}

const char* name_of(GemvEpilogue e) {
  return e == GemvEpilogue::kAdd ? "add" : e == GemvEpilogue::kSwiGlu ? "swiglu" : "store";
}

class GemvStreamChain : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda_ = cuda_backend();
    ASSERT_NE(cuda_, nullptr) << "CUDA backend unavailable: " << cuda_status();
    int dev = 0, major = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
    if (major < 9) GTEST_SKIP() << "the streamed chain needs sm_90 (bulk copies)";
    stream_ = dynamic_cast<cuda::CudaBackend*>(cuda_)->stream();
    const std::vector<uint32_t> zeros(cuda::kStreamChainCounters, 0);
    counter_ = std::make_unique<DevBuf>(*cuda_, zeros.size() * 4);
    counter_->upload(zeros.data(), zeros.size() * 4);
  }
  // Launches `phases` (host descriptors of device pointers) as one chain and waits for it;
  // with `times`, the timed build of the kernel; `att`, the operands of an attention phase.
  void launch(const std::vector<cuda::StreamPhase>& phases, cuda::StreamChainTimes* times = nullptr,
              const cuda::StreamAttention* att = nullptr) {
    ASSERT_LE(phases.size(), static_cast<size_t>(cuda::kMaxStreamPhases));
    cuda::StreamChain chain;
    for (const auto& ph : phases) {
      if (ph.kind == cuda::StreamPhase::Kind::kAttention) {
        ASSERT_NE(att, nullptr);
        ASSERT_TRUE(cuda::gemv_stream_attention_supported(*att));
        chain.att = *att;
      } else {
        ASSERT_TRUE(cuda::gemv_stream_chain_supported(ph));
      }
      chain.phase[chain.n_phases++] = ph;
    }
    cuda::launch_gemv_stream_chain(chain, static_cast<unsigned*>(counter_->data()), 1e-5f, stream_,
                                   times);
    cuda_->synchronize();
  }
  // A launch's StreamChainTimes, zeroed, for `launch`; then what it holds.
  std::unique_ptr<DevBuf> zeroed_times() {
    const std::vector<uint8_t> zeros(sizeof(cuda::StreamChainTimes), 0);
    auto d = std::make_unique<DevBuf>(*cuda_, zeros.size());
    d->upload(zeros.data(), zeros.size());
    return d;
  }
  static cuda::StreamChainTimes* times_of(const DevBuf& d) {
    return static_cast<cuda::StreamChainTimes*>(d.data());
  }
  static void read_times(const DevBuf& d, cuda::StreamChainTimes& t) {
    ASSERT_EQ(cudaMemcpy(&t, d.data(), sizeof t, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void expect_counter_zero() {
    const std::vector<uint32_t> c = counter_->download<uint32_t>();
    for (size_t i = 0; i < c.size(); ++i)
      EXPECT_EQ(c[i], 0u) << "the launch left its counter " << i << " set";
  }

  Backend* cuda_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DevBuf> counter_;
};

TEST_F(GemvStreamChain, EachPhaseAgainstHost) {
  const int blocks = cuda::gemv_stream_chain_blocks();
  std::vector<PhaseCase> cases;
  for (GemvEpilogue e : {GemvEpilogue::kStore, GemvEpilogue::kAdd, GemvEpilogue::kSwiGlu}) {
    for (bool norm : {false, true}) {
      if (e == GemvEpilogue::kAdd && norm) continue;  // not a form the chains take
      const int pair = e == GemvEpilogue::kSwiGlu ? 2 : 1;
      cases.push_back({pair * 7, 64, e, norm});                  // fewer outputs than blocks
      cases.push_back({pair * (blocks * 3 + 5), 200, e, norm});  // outputs that do not divide
      cases.push_back({pair * 111, 19 * 8, e, norm});            // odd widths
      cases.push_back({pair * 1408, 2048, e, norm});             // V2-Lite's hidden size
      cases.push_back({pair * 4096, e == GemvEpilogue::kAdd ? 14336 : 4096, e, norm});
    }
  }
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const PhaseCase& c = cases[ci];
    const uint64_t seed = base_seed() + 900 + ci;
    Rng rng(seed);
    const int outputs = c.epilogue == GemvEpilogue::kSwiGlu ? c.m / 2 : c.m;
    const auto x = random_bf16_values(rng, c.k);
    const auto w = random_bf16_values(rng, static_cast<int64_t>(c.m) * c.k, 0.05f);
    std::vector<float> norm_w(c.k);
    for (auto& v : norm_w) v = rng.uniform(0.5f, 1.5f);
    const auto out0 = random_bf16_values(rng, outputs);
    auto x_d = upload_bf16(*cuda_, x);
    auto w_d = upload_bf16(*cuda_, w);
    auto n_d = upload_raw(*cuda_, norm_w);
    auto out_d = upload_bf16(*cuda_, out0);
    cuda::StreamPhase ph;
    ph.w = w_d->data();
    ph.m = c.m;
    ph.k = c.k;
    ph.x = x_d->data();
    ph.norm_w = c.norm ? static_cast<const float*>(n_d->data()) : nullptr;
    ph.out = out_d->data();
    ph.epilogue = c.epilogue;
    launch({ph});
    std::vector<float> want, slack;
    reference(c, x, w, norm_w, out0, want, slack);
    const std::string what = Label("gemv_stream_chain", seed)("m", c.m)("k", c.k)(
        "epilogue", name_of(c.epilogue))("norm", c.norm);
    EXPECT_TRUE(compare(what, download_bf16(*out_d), want, kBf16Tol, &slack));
    EXPECT_TRUE(guards_ok(what, *out_d));
    expect_counter_zero();
  }
}

// A decode layer's four products (norm + q|k|v, o_proj + residual, norm + gate|up with SwiGLU,
// down + residual) for several layers, each with its own weights: one launch against a launch a
// phase, bit for bit, and one launch again on the counter the last one left.
TEST_F(GemvStreamChain, ChainedEqualsPhaseByPhase) {
  struct Dims {
    int hidden, qkv, inter, layers;
  };
  for (const Dims d :
       {Dims{256, 384, 344, 2}, Dims{2048, 3648, 1408, 2}, Dims{4096, 6144, 14336, 2}}) {
    const uint64_t seed = base_seed() + 950 + d.hidden;
    Rng rng(seed);
    const PhaseCase shapes[4] = {{d.qkv, d.hidden, GemvEpilogue::kStore, true},
                                 {d.hidden, d.hidden, GemvEpilogue::kAdd, false},
                                 {2 * d.inter, d.hidden, GemvEpilogue::kSwiGlu, true},
                                 {d.hidden, d.inter, GemvEpilogue::kAdd, false}};
    std::vector<std::unique_ptr<DevBuf>> weights;
    for (int l = 0; l < d.layers; ++l)
      for (const PhaseCase& s : shapes)
        weights.push_back(
            upload_bf16(*cuda_, random_bf16_values(rng, static_cast<int64_t>(s.m) * s.k, 0.05f)));
    std::vector<float> norm_w(d.hidden);
    for (auto& v : norm_w) v = rng.uniform(0.5f, 1.5f);
    auto n_d = upload_raw(*cuda_, norm_w);
    const auto resid0 = random_bf16_values(rng, d.hidden);
    auto resid = upload_bf16(*cuda_, resid0);
    auto qkv = upload_bf16(*cuda_, std::vector<float>(d.qkv, 0.0f));
    auto act = upload_bf16(*cuda_, std::vector<float>(d.inter, 0.0f));
    std::vector<cuda::StreamPhase> phases;
    for (int l = 0; l < d.layers; ++l) {
      DevBuf* const xs[4] = {resid.get(), qkv.get(), resid.get(), act.get()};
      DevBuf* const outs[4] = {qkv.get(), resid.get(), act.get(), resid.get()};
      for (int i = 0; i < 4; ++i) {
        cuda::StreamPhase ph;
        ph.w = weights[l * 4 + i]->data();
        ph.m = shapes[i].m;
        ph.k = shapes[i].k;
        ph.x = xs[i]->data();
        ph.norm_w = shapes[i].norm ? static_cast<const float*>(n_d->data()) : nullptr;
        ph.out = outs[i]->data();
        ph.epilogue = shapes[i].epilogue;
        phases.push_back(ph);
      }
    }
    const auto outputs = [&] {
      std::vector<float> v = download_bf16(*resid);
      for (float f : download_bf16(*qkv)) v.push_back(f);
      for (float f : download_bf16(*act)) v.push_back(f);
      return v;
    };
    const std::vector<uint16_t> resid_bits = to_bf16_bits(resid0);
    for (const auto& ph : phases) launch({ph});
    const std::vector<float> one_by_one = outputs();
    const std::string what = Label("gemv_stream_chain layers", seed)("hidden", d.hidden)(
        "qkv", d.qkv)("inter", d.inter)("layers", d.layers);
    for (int rep = 0; rep < 2; ++rep) {
      resid->upload(resid_bits.data(), d.hidden * 2);
      launch(phases);
      EXPECT_TRUE(
          compare(what + " one launch, run " + std::to_string(rep), outputs(), one_by_one, kExact));
      expect_counter_zero();
    }
    // The timed build (PAGELLM_CHAIN_TIMES): the same outputs, and a time for every phase of
    // its one launch, each block's at most the sum over blocks.
    const auto times_d = zeroed_times();
    resid->upload(resid_bits.data(), d.hidden * 2);
    launch(phases, times_of(*times_d));
    EXPECT_TRUE(compare(what + " timed launch", outputs(), one_by_one, kExact));
    expect_counter_zero();
    cuda::StreamChainTimes t;
    ASSERT_NO_FATAL_FAILURE(read_times(*times_d, t));
    const int n = static_cast<int>(phases.size());
    for (int len = 0; len <= cuda::kMaxStreamPhases; ++len)
      EXPECT_EQ(t.launches[len], len == n ? 1ull : 0ull) << what << ": launches of " << len;
    for (int p = 0; p < n; ++p) {
      EXPECT_GT(t.work[n][p], 0u) << what << ": phase " << p << " took no time";
      EXPECT_LE(t.work_max[n][p], t.work[n][p]) << what << ": phase " << p;
      EXPECT_LE(t.wait_max[n][p], t.wait[n][p]) << what << ": phase " << p;
      EXPECT_LT(t.work[n][p] + t.wait[n][p], 1000000000ull * cuda::gemv_stream_chain_blocks())
          << what << ": phase " << p << " took over a second a block";
    }
    for (const DevBuf* b : {resid.get(), qkv.get(), act.get()}) EXPECT_TRUE(guards_ok(what, *b));
  }
}

// The attention phase (StreamAttention) against the backend's own RoPE with the KV store and
// attention for one token: the output within bf16 rounding (the pieces are summed and merged in
// another order), the token's cache row as the RoPE kernel stores it, every other cache row
// untouched. Then the phase followed by a product that reads its output (o_proj's form), the
// product against the host's product of the phase's output: a product phase that started
// before every piece was merged would read stale rows.
TEST_F(GemvStreamChain, AttentionPhaseMatchesRopeAndAttention) {
  struct AttnCase {
    int hq, hkv, len;
    bool interleaved;
    int splits = 0;  // pieces a KV head; 0: one a chain block, as the backend picks them
  };
  const int bs = 16, d = 128;
  uint64_t seed = base_seed() + 980;
  int cases = 0;
  for (const AttnCase c :
       {AttnCase{32, 32, 1, false}, AttnCase{32, 32, 7, true}, AttnCase{32, 8, 19, false},
        AttnCase{32, 8, 111, true}, AttnCase{32, 32, 640, false}, AttnCase{32, 8, 640, false},
        AttnCase{8, 2, 2047, true}, AttnCase{4, 4, 33, false},
        // One piece (the output stored without a merge); three; a piece longer than the shared
        // memory's room for its block-table entries (it reads them where they are).
        AttnCase{32, 32, 640, false, 1}, AttnCase{8, 2, 2047, false, 3},
        AttnCase{4, 4, 8000, true, 1}}) {
    Rng rng(++seed);
    const int row = (c.hq + 2 * c.hkv) * d;
    const auto qkv = random_bf16_values(rng, row, 2.0f);
    PagedBatch pb = paged_batch(rng, decode_seqs({c.len}), 0, bs);
    const int64_t cache_n = pb.pool * bs * c.hkv * d;
    const auto kc = random_bf16_values(rng, cache_n), vc = random_bf16_values(rng, cache_n);
    std::vector<float> cs(d);
    for (int j = 0; j < d / 2; ++j) {
      const double a = (c.len - 1) * std::pow(500000.0, -2.0 * j / d);
      cs[j] = static_cast<float>(std::cos(a));
      cs[d / 2 + j] = static_cast<float>(std::sin(a));
    }
    const int32_t last = c.len - 1;
    const std::vector<int32_t> slot = {pb.table[last / bs] * bs + last % bs};
    auto cs_d = upload_raw(*cuda_, cs);
    auto slot_d = upload_raw(*cuda_, slot);
    auto cu_d = upload_raw(*cuda_, pb.cu), lens_d = upload_raw(*cuda_, pb.lens);
    auto table_d = upload_raw(*cuda_, pb.table);
    AttentionMeta meta;
    meta.n_seqs = 1;
    meta.cu_seqlens_q = cu_d->view(DType::kI32, {2});
    meta.seq_lens_kv = lens_d->view(DType::kI32, {1});
    meta.block_tables = table_d->view(DType::kI32, {1, pb.table_ld});
    meta.block_size = bs;
    meta.max_seqlen_q = 1;
    meta.max_seqlen_kv = c.len;
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(d));

    // The backend's two ops, on their own copies.
    auto qkv_r = upload_bf16(*cuda_, qkv);
    auto kc_r = upload_bf16(*cuda_, kc), vc_r = upload_bf16(*cuda_, vc);
    auto out_r = upload_bf16(*cuda_, std::vector<float>(c.hq * d, 0.0f));
    {
      Tensor q = qkv_r->view(DType::kBF16, {1, c.hq, d});
      Tensor k = Tensor(static_cast<char*>(qkv_r->data()) + c.hq * d * 2, DType::kBF16,
                        {1, c.hkv, d}, Device::kCuda);
      Tensor v = Tensor(static_cast<char*>(qkv_r->data()) + (c.hq + c.hkv) * d * 2, DType::kBF16,
                        {1, c.hkv, d}, Device::kCuda);
      Tensor kct = kc_r->view(DType::kBF16, {pb.pool, bs, c.hkv, d});
      Tensor vct = vc_r->view(DType::kBF16, {pb.pool, bs, c.hkv, d});
      Tensor cst = cs_d->view(DType::kF32, {1, d});
      Tensor slots = slot_d->view(DType::kI32, {1});
      Tensor out = out_r->view(DType::kBF16, {1, c.hq, d});
      const Backend::AttentionLink link{&q,   &k,   &v,    &cst,    c.interleaved, &slots,
                                        &kct, &vct, &meta, &params, &out};
      cuda_->run_attention_link(link);
      cuda_->synchronize();
    }

    // The phase, alone, then with a product after it.
    auto qkv_c = upload_bf16(*cuda_, qkv);
    auto kc_c = upload_bf16(*cuda_, kc), vc_c = upload_bf16(*cuda_, vc);
    auto out_c = upload_bf16(*cuda_, std::vector<float>(c.hq * d, 0.0f));
    const int blocks = cuda::gemv_stream_chain_blocks();
    cuda::StreamPhase ph;
    ph.kind = cuda::StreamPhase::Kind::kAttention;
    cuda::StreamAttention a;
    a.qkv = qkv_c->data();
    a.cos_sin = static_cast<const float*>(cs_d->data());
    a.interleaved = c.interleaved;
    a.slot = static_cast<const int32_t*>(slot_d->data());
    a.seq_len = static_cast<const int32_t*>(lens_d->data());
    a.block_table = static_cast<const int32_t*>(table_d->data());
    for (auto [view, buf] : {std::pair{&a.k_cache, kc_c.get()}, std::pair{&a.v_cache, vc_c.get()}})
      *view = cuda::CacheView{buf->data(),        pb.pool, bs, c.hkv, d, int64_t{bs} * c.hkv * d,
                              int64_t{c.hkv} * d, d};
    a.hq = c.hq;
    a.hkv = c.hkv;
    a.head_dim = d;
    a.splits =
        c.splits > 0 ? c.splits : std::min(cuda::kStreamMaxSplits, std::max(1, blocks / c.hkv));
    a.scale = params.scale;
    auto partials = std::make_unique<DevBuf>(
        *cuda_, std::max<int64_t>(4, cuda::stream_attention_partials(a) * 4));
    a.partials = static_cast<float*>(partials->data());
    a.out = out_c->data();
    const std::string what = Label("gemv_stream_chain attention", seed)("hq", c.hq)("hkv", c.hkv)(
        "len", c.len)("interleaved", c.interleaved)("splits", a.splits);
    launch({ph}, nullptr, &a);
    ++cases;
    EXPECT_TRUE(compare(what + " out", download_bf16(*out_c), download_bf16(*out_r), kBf16Tol));
    EXPECT_TRUE(compare(what + " k_cache", download_bf16(*kc_c), download_bf16(*kc_r), kBf16Tol));
    EXPECT_TRUE(compare(what + " v_cache", download_bf16(*vc_c), download_bf16(*vc_r), kExact));
    EXPECT_TRUE(compare(what + " q|k|v unchanged", download_bf16(*qkv_c), qkv, kExact));
    expect_counter_zero();

    // The timed build (PAGELLM_CHAIN_TIMES): the same output bit for bit (the token's k and v
    // stored again, unchanged), steps stamped by every block that takes part, and the pieces'
    // merge by one block a KV head when there are pieces to merge. (A step's time alone may be
    // under the global timer's tick; the steps' sum over a block's loads is not.)
    {
      const std::vector<float> untimed = download_bf16(*out_c);
      const auto times_d = zeroed_times();
      launch({ph}, times_of(*times_d), &a);
      EXPECT_TRUE(compare(what + " timed out", download_bf16(*out_c), untimed, kExact));
      expect_counter_zero();
      cuda::StreamChainTimes t;
      ASSERT_NO_FATAL_FAILURE(read_times(*times_d, t));
      EXPECT_EQ(t.attention_blocks, static_cast<unsigned long long>(c.hkv) * a.splits) << what;
      EXPECT_EQ(t.merging_blocks, a.splits > 1 ? static_cast<unsigned long long>(c.hkv) : 0ull)
          << what;
      unsigned long long steps = 0;
      for (int i = 0; i < cuda::kStreamAttentionSteps; ++i) steps += t.attention_step[i];
      EXPECT_GT(steps, 0ull) << what << ": the attention steps took no time";
      if (a.splits == 1) {
        EXPECT_EQ(t.attention_step[cuda::kStreamAttentionSteps - 1], 0ull) << what << ": a merge";
      }
      EXPECT_EQ(t.launches[1], 1ull) << what;
    }

    // o_proj's form after it: out2 += attn . w^T, against the host's product of attn.
    const int m = 256;
    const auto w = random_bf16_values(rng, static_cast<int64_t>(m) * c.hq * d, 0.05f);
    const auto resid = random_bf16_values(rng, m);
    auto w_d = upload_bf16(*cuda_, w);
    auto out2 = upload_bf16(*cuda_, resid);
    cuda::StreamPhase prod;
    prod.w = w_d->data();
    prod.m = m;
    prod.k = c.hq * d;
    prod.x = out_c->data();
    prod.out = out2->data();
    prod.epilogue = GemvEpilogue::kAdd;
    launch({ph, prod}, nullptr, &a);
    const std::vector<float> attn = download_bf16(*out_c);
    std::vector<float> want, slack;
    reference({m, c.hq * d, GemvEpilogue::kAdd, false}, attn, w, {}, resid, want, slack);
    EXPECT_TRUE(compare(what + " then o_proj", download_bf16(*out2), want, kBf16Tol));
    expect_counter_zero();
    for (const DevBuf* b : {out_c.get(), kc_c.get(), vc_c.get(), out2.get(), partials.get()})
      EXPECT_TRUE(guards_ok(what, *b));
  }
  EXPECT_EQ(cases, 11);
}

}  // namespace
}  // namespace pagellm::optest
