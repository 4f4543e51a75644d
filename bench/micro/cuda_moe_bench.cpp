// Routed experts on the CUDA backend (Backend::moe_experts: sort, grouped GEMVs or grouped
// tensor-core GEMMs, combine; src/backend/cuda/moe.cu, moe_gemm.cu) for one layer of
// DeepSeek-V2-Lite (64 experts of 2048 x 1408, top 6, shared experts' output added) and of
// Mixtral-8x7B (8 of 4096 x 14336, top 2), bf16 weights stacked as the model loads them, random
// routing (distinct experts per token). Reported per call:
//   time          CUDA events around kReps back-to-back calls on the backend's stream, / kReps
//   GB/s          the weights of the experts the step touches (each read once) over the time
//   TFLOP/s       the routed products' flops (2 x 3 D F per token and expert) over the time
//   experts       distinct experts touched
//   cuda_moe_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_bench_util.h"

namespace pagellm {
namespace {

constexpr int kReps = 10;

struct MoeShape {
  const char* name;
  int64_t E, K, D, F;
  bool shared;
};
constexpr MoeShape kV2Lite{"deepseek-v2-lite", 64, 6, 2048, 1408, true};
constexpr MoeShape kMixtral{"mixtral-8x7b", 8, 2, 4096, 14336, false};

void run_case(benchmark::State& state, const MoeShape& S) {
  const int64_t n = state.range(0);
  Backend* be = bench::cuda_or_skip(state);
  if (be == nullptr) return;
  Backend& cuda = *be;
  auto gu_buf = cuda.allocate(S.E * 2 * S.F * S.D * 2);
  auto dn_buf = cuda.allocate(S.E * S.D * S.F * 2);
  auto h_buf = cuda.allocate(n * S.D * 2);
  auto sh_buf = cuda.allocate(n * S.D * 2);
  auto out_buf = cuda.allocate(n * S.D * 2);
  MoeExpertWeights w;
  w.gate_up = gu_buf->view(DType::kBF16, {S.E, 2 * S.F, S.D});
  w.down = dn_buf->view(DType::kBF16, {S.E, S.D, S.F});
  Tensor h = h_buf->view(DType::kBF16, {n, S.D});
  Tensor shared = S.shared ? sh_buf->view(DType::kBF16, {n, S.D}) : Tensor();
  Tensor out = out_buf->view(DType::kBF16, {n, S.D});
  cuda.fill_random(w.gate_up, 1, -0.02f, 0.02f);
  cuda.fill_random(w.down, 2, -0.02f, 0.02f);
  cuda.fill_random(h, 3, -1.0f, 1.0f);
  if (S.shared) cuda.fill_random(shared, 4, -1.0f, 1.0f);

  // Each token's K experts: distinct, drawn at random; weights summing to 1.
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> ids(n * S.K), pool(S.E);
  std::vector<float> weights(n * S.K, 1.0f / static_cast<float>(S.K));
  std::iota(pool.begin(), pool.end(), 0);
  std::set<int32_t> touched;
  for (int64_t t = 0; t < n; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t k = 0; k < S.K; ++k) {
      ids[t * S.K + k] = pool[k];
      touched.insert(pool[k]);
    }
  }
  auto ids_buf = cuda.allocate(n * S.K * 4);
  auto w_buf = cuda.allocate(n * S.K * 4);
  cuda.copy_from_host(ids_buf->data(), ids.data(), n * S.K * 4);
  cuda.copy_from_host(w_buf->data(), weights.data(), n * S.K * 4);
  Tensor ids_t = ids_buf->view(DType::kI32, {n, S.K});
  Tensor w_t = w_buf->view(DType::kF32, {n, S.K});

  const double per_call_s = bench::time_calls(
      cuda, state, kReps, [&] { cuda.moe_experts(h, ids_t, w_t, w, shared, out); });
  const double bytes = static_cast<double>(touched.size()) * 3.0 * S.D * S.F * 2.0;
  state.counters["GB/s"] = bytes / per_call_s * 1e-9;
  state.counters["TFLOP/s"] = 6.0 * static_cast<double>(n * S.K) * S.D * S.F / per_call_s * 1e-12;
  state.counters["experts"] = static_cast<double>(touched.size());
  state.SetLabel(std::string(S.name) + ", " + std::to_string(n) + " tokens");
}

void BM_MoeExpertsV2Lite(benchmark::State& state) {
  run_case(state, kV2Lite);
}
void BM_MoeExpertsMixtral(benchmark::State& state) {
  run_case(state, kMixtral);
}

// Decode sizes (the grouped GEMVs) and larger steps (the grouped GEMMs): 16384 tokens is the
// offline runs' step budget.
BENCHMARK(BM_MoeExpertsV2Lite)
    ->ArgName("tokens")
    ->Arg(1)
    ->Arg(8)
    ->Arg(64)
    ->Arg(512)
    ->Arg(4096)
    ->Arg(16384)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MoeExpertsMixtral)
    ->ArgName("tokens")
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Arg(512)
    ->Arg(4096)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
