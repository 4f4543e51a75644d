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
    counter_ = std::make_unique<DevBuf>(*cuda_, 4);
    const uint32_t zero = 0;
    counter_->upload(&zero, 4);
  }
  // Launches `phases` (host descriptors of device pointers) as one chain and waits for it;
  // with `times`, the timed build of the kernel.
  void launch(const std::vector<cuda::StreamPhase>& phases,
              cuda::StreamChainTimes* times = nullptr) {
    ASSERT_LE(phases.size(), static_cast<size_t>(cuda::kMaxStreamPhases));
    cuda::StreamChain chain;
    for (const auto& ph : phases) {
      ASSERT_TRUE(cuda::gemv_stream_chain_supported(ph));
      chain.phase[chain.n_phases++] = ph;
    }
    cuda::launch_gemv_stream_chain(chain, static_cast<unsigned*>(counter_->data()), 1e-5f, stream_,
                                   times);
    cuda_->synchronize();
  }
  void expect_counter_zero() {
    EXPECT_EQ(counter_->download<uint32_t>()[0], 0u) << "the launch left its counter set";
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
    const std::vector<uint8_t> zeros(sizeof(cuda::StreamChainTimes), 0);
    DevBuf times_d(*cuda_, zeros.size());
    times_d.upload(zeros.data(), zeros.size());
    resid->upload(resid_bits.data(), d.hidden * 2);
    launch(phases, static_cast<cuda::StreamChainTimes*>(times_d.data()));
    EXPECT_TRUE(compare(what + " timed launch", outputs(), one_by_one, kExact));
    expect_counter_zero();
    cuda::StreamChainTimes t;
    ASSERT_EQ(cudaMemcpy(&t, times_d.data(), sizeof t, cudaMemcpyDeviceToHost), cudaSuccess);
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

}  // namespace
}  // namespace pagellm::optest
