// The decode GEMV (src/backend/cuda/gemv.cu) on the batch-1 projections of Llama-3-8B and
// DeepSeek-V2-Lite, for each way of splitting K among a row group's warps (0: the rule the backend
// uses). One case is one projection of one token: x [1, K] . w[M, K]^T, bf16. The weights rotate
// through copies filling three L2s, so each call streams its matrix from HBM as decode does, and
// the calls are replayed from a CUDA graph (launched overlapped, as in a decode step's graph), so
// host launch time does not count. Reported per call:
//   time   CUDA events around one replay of kCalls calls, / kCalls
//   GB/s   the weight bytes over the time (the ceiling: 4.25 TB/s device copy on an H200)
//   cuda_gemv_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace pagellm {
namespace {

constexpr int kCalls = 64;

struct Shape {
  const char* name;
  int64_t m, k;
  cuda::GemvEpilogue epilogue;  // kAdd where the model adds the product to the residual
};
constexpr Shape kShapes[] = {
    {"llama-3-8b q|k|v", 6144, 4096, cuda::GemvEpilogue::kStore},
    {"llama-3-8b o_proj", 4096, 4096, cuda::GemvEpilogue::kAdd},
    {"llama-3-8b gate|up", 28672, 4096, cuda::GemvEpilogue::kStore},
    {"llama-3-8b down", 4096, 14336, cuda::GemvEpilogue::kAdd},
    {"llama-3-8b lm_head", 128256, 4096, cuda::GemvEpilogue::kStore},
    {"v2-lite q", 3072, 2048, cuda::GemvEpilogue::kStore},
    {"v2-lite kv_a", 576, 2048, cuda::GemvEpilogue::kStore},
    {"v2-lite o_proj", 2048, 2048, cuda::GemvEpilogue::kAdd},
    {"v2-lite shared gate|up", 5632, 2048, cuda::GemvEpilogue::kStore},
    {"v2-lite shared down", 2048, 2816, cuda::GemvEpilogue::kAdd},
};

void BM_Gemv(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int split = static_cast<int>(state.range(1));
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return;
  }
  int l2_bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const size_t w_bytes = static_cast<size_t>(s.m * s.k) * 2;
  const int copies =
      static_cast<int>(std::max<size_t>(2, 3 * static_cast<size_t>(l2_bytes) / w_bytes + 1));
  void* w = nullptr;
  void* x = nullptr;
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&w, w_bytes * copies));
  CUDA_CHECK(cudaMalloc(&x, s.k * 2));
  CUDA_CHECK(cudaMalloc(&out, s.m * 2));
  // 0x3c00 is bf16 0.0078: finite values; what they are does not change the time.
  CUDA_CHECK(cudaMemset(w, 0x3c, w_bytes * copies));
  CUDA_CHECK(cudaMemset(x, 0x3c, s.k * 2));
  CUDA_CHECK(cudaMemset(out, 0, s.m * 2));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::GemvFusion f;
  f.epilogue = s.epilogue;
  f.k_split = split;
  const cuda::RowView xv{x, DType::kBF16, 1, s.k, s.k};
  const cuda::RowView ov{out, DType::kBF16, 1, s.m, s.m};
  const auto call = [&](int i) {
    const cuda::RowView wv{static_cast<char*>(w) + (i % copies) * w_bytes, DType::kBF16, s.m, s.k,
                           s.k};
    cuda::launch_gemv(xv, wv, nullptr, DType::kF32, ov, stream, f);
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) call(i);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t ev[2];
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  double total_s = 0.0;
  for (auto _ : state) {
    CUDA_CHECK(cudaEventRecord(ev[0], stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(ev[1], stream));
    CUDA_CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    const double per_call = ms / 1e3 / kCalls;
    state.SetIterationTime(per_call);
    total_s += per_call;
  }
  const double per_call_s = total_s / static_cast<double>(std::max<int64_t>(state.iterations(), 1));
  state.counters["us"] = per_call_s * 1e6;
  state.counters["GB/s"] = static_cast<double>(w_bytes) / per_call_s * 1e-9;
  state.SetLabel(std::string(s.name) + " " + std::to_string(s.m) + "x" + std::to_string(s.k) +
                 ", k_split " + (split == 0 ? std::string("rule") : std::to_string(split)));
  for (auto& e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(w);
  cudaFree(x);
  cudaFree(out);
}

void shape_cases(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(kShapes)); ++i)
    for (int64_t split : {0, 1, 2, 4, 8}) b->Args({i, split});
}
BENCHMARK(BM_Gemv)->Apply(shape_cases)->UseManualTime()->Iterations(20);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
