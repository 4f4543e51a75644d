// cuBLASLt's candidates for the Llama-3-8B projections at prefill and large-batch decode sizes:
// how far the heuristic's first choice (what src/backend/cuda/gemm.cu runs) is from the fastest
// algorithm cuBLASLt offers for the shape, to tell whether timing the candidates would pay.
// One case is (projection, tokens, candidate): out[n, M] = x[n, K] . w[M, K]^T, bf16 in and out,
// fp32 accumulation, run by Gemm itself; candidate i is the heuristic's i-th answer for Gemm's
// descriptors (Gemm::candidates, up to kCandidates). Reported: time per call (CUDA events around
// kReps calls) and TFLOP/s (the ceiling: 798 TFLOP/s bf16 dense on an H200, measured).
//   cuda_gemm_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "cuda_bench_util.h"

namespace pagellm {
namespace {

constexpr int kCandidates = 12;
constexpr int kReps = 10;

struct Shape {
  const char* name;
  int64_t m, k;
};
constexpr Shape kShapes[] = {
    {"q|k|v", 6144, 4096},
    {"o_proj", 4096, 4096},
    {"gate|up", 28672, 4096},
    {"down", 4096, 14336},
};
constexpr int64_t kTokens[] = {512, 2048, 16384};

// One problem's buffers, and the candidates Gemm (src/backend/cuda/gemm.h) has for it.
struct Problem {
  void *w = nullptr, *x = nullptr, *out = nullptr;
  cuda::RowView xv, wv, ov;
  cuda::Gemm gemm;
  std::vector<cublasLtMatmulAlgo_t> candidates;

  Problem(int64_t n, int64_t m, int64_t k, cudaStream_t stream) : gemm(stream) {
    CUDA_CHECK(cudaMalloc(&w, m * k * 2));
    CUDA_CHECK(cudaMalloc(&x, n * k * 2));
    CUDA_CHECK(cudaMalloc(&out, n * m * 2));
    // 0x3c3c is bf16 0.0115: finite values; what they are does not change the time.
    CUDA_CHECK(cudaMemset(w, 0x3c, m * k * 2));
    CUDA_CHECK(cudaMemset(x, 0x3c, n * k * 2));
    xv = cuda::RowView{x, DType::kBF16, n, k, k};
    wv = cuda::RowView{w, DType::kBF16, m, k, k};
    ov = cuda::RowView{out, DType::kBF16, n, m, m};
    candidates = gemm.candidates(xv, wv, ov, kCandidates);
  }
  ~Problem() {
    cudaFree(w);
    cudaFree(x);
    cudaFree(out);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  void run(int i) { gemm.run_candidate(xv, wv, ov, candidates[i]); }
};

void BM_GemmCandidate(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int64_t n = state.range(1);
  const int cand = static_cast<int>(state.range(2));
  if (bench::cuda_or_skip(state) == nullptr) return;  // no device: skipped, with the reason
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Problem p(n, s.m, s.k, stream);
    if (cand >= static_cast<int>(p.candidates.size())) {
      state.SkipWithError("the heuristic has fewer candidates");
      cudaStreamDestroy(stream);
      return;
    }
    cudaEvent_t ev[2];
    for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
    p.run(cand);  // warm-up
    double total_s = 0.0;
    for (auto _ : state) {
      CUDA_CHECK(cudaEventRecord(ev[0], stream));
      for (int r = 0; r < kReps; ++r) p.run(cand);
      CUDA_CHECK(cudaEventRecord(ev[1], stream));
      CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      state.SetIterationTime(ms / 1e3 / kReps);
      total_s += ms / 1e3 / kReps;
    }
    const double per_call = total_s / static_cast<double>(std::max<int64_t>(state.iterations(), 1));
    state.counters["TFLOP/s"] = 2.0 * static_cast<double>(n * s.m * s.k) / per_call * 1e-12;
    state.SetLabel(std::string(s.name) + " " + std::to_string(n) + " x " + std::to_string(s.m) +
                   " x " + std::to_string(s.k) + ", candidate " + std::to_string(cand) + " of " +
                   std::to_string(p.candidates.size()));
    for (auto& e : ev) cudaEventDestroy(e);
  }  // the Problem's buffers and cuBLASLt handle go before its stream
  cudaStreamDestroy(stream);
}

void cases(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(kShapes)); ++i)
    for (int64_t n : kTokens)
      for (int64_t c = 0; c < kCandidates; ++c) b->Args({i, n, c});
}
BENCHMARK(BM_GemmCandidate)->Apply(cases)->UseManualTime()->Iterations(5);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
