// The decode GEMV (src/backend/cuda/gemv.cu) on the batch-1 projections of Llama-3-8B and
// DeepSeek-V2-Lite, for each way of splitting K among a row group's warps (0: the rule the backend
// uses), and with each fusion of a pre-norm projection (BM_GemvFusion). One case is one projection
// of one token: x [1, K] . w[M, K]^T, bf16. The weights rotate through copies filling three L2s, so
// each call streams its matrix from HBM as decode does, and the calls are replayed from a CUDA
// graph (launched overlapped, as in a decode step's graph), so host launch time does not count.
// BM_GemvLayerChain runs a layer's four projections back to back instead (the hand-overs).
// Reported per call:
//   time   CUDA events around one replay of kCalls calls, / kCalls
//   GB/s   the weight bytes over the time (the ceiling: 4.25 TB/s device copy on an H200)
//   cuda_gemv_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"

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
    {"v2-lite q|kv_a", 3648, 2048, cuda::GemvEpilogue::kStore},  // as the model stacks them
    {"v2-lite o_proj", 2048, 2048, cuda::GemvEpilogue::kAdd},
    {"v2-lite shared gate|up", 5632, 2048, cuda::GemvEpilogue::kStore},
    {"v2-lite shared down", 2048, 2816, cuda::GemvEpilogue::kAdd},
};

// Captures `record` (the launches of one replay) into a graph on `stream`, replays it once to
// warm up, then once per benchmark iteration between two events; returns the mean seconds a
// replay took (each iteration's time reported as one replay's over `per`).
double time_replays(benchmark::State& state, cudaStream_t stream,
                    const std::function<void()>& record, double per) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  record();
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
    state.SetIterationTime(ms / 1e3 / per);
    total_s += ms / 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return total_s / static_cast<double>(std::max<int64_t>(state.iterations(), 1));
}

bool have_device(benchmark::State& state) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// Times kCalls launches of one product (the weights [m, k], x [rows, k], out [rows, out_cols])
// with `fusion`, replayed from a graph, and reports them under `label`.
void time_gemv(benchmark::State& state, int64_t m, int64_t k, int64_t out_cols,
               cuda::GemvFusion fusion, const std::string& label, int64_t rows = 1) {
  if (!have_device(state)) return;
  int l2_bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const size_t w_bytes = static_cast<size_t>(m * k) * 2;
  const int copies =
      static_cast<int>(std::max<size_t>(2, 3 * static_cast<size_t>(l2_bytes) / w_bytes + 1));
  void* w = nullptr;
  void* x = nullptr;
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&w, w_bytes * copies));
  CUDA_CHECK(cudaMalloc(&x, rows * k * 2));
  CUDA_CHECK(cudaMalloc(&out, rows * out_cols * 2));
  // 0x3c00 is bf16 0.0078: finite values; what they are does not change the time.
  CUDA_CHECK(cudaMemset(w, 0x3c, w_bytes * copies));
  CUDA_CHECK(cudaMemset(x, 0x3c, rows * k * 2));
  CUDA_CHECK(cudaMemset(out, 0, rows * out_cols * 2));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cuda::RowView xv{x, DType::kBF16, rows, k, k};
  const cuda::RowView ov{out, DType::kBF16, rows, out_cols, out_cols};
  const auto call = [&](int i) {
    const cuda::RowView wv{static_cast<char*>(w) + (i % copies) * w_bytes, DType::kBF16, m, k, k};
    cuda::launch_gemv(xv, wv, nullptr, DType::kF32, ov, stream, fusion);
  };
  const double per_call_s = time_replays(
                                state, stream,
                                [&] {
                                  for (int i = 0; i < kCalls; ++i) call(i);
                                },
                                kCalls) /
                            kCalls;
  state.counters["us"] = per_call_s * 1e6;
  state.counters["GB/s"] = static_cast<double>(w_bytes) / per_call_s * 1e-9;
  state.SetLabel(label);
  cudaStreamDestroy(stream);
  cudaFree(w);
  cudaFree(x);
  cudaFree(out);
}

void BM_Gemv(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int split = static_cast<int>(state.range(1));
  cuda::GemvFusion f;
  f.epilogue = s.epilogue;
  f.k_split = split;
  time_gemv(state, s.m, s.k, s.m, f,
            std::string(s.name) + " " + std::to_string(s.m) + "x" + std::to_string(s.k) +
                ", k_split " + (split == 0 ? std::string("rule") : std::to_string(split)));
}

// The fusions a decode layer could take into its two pre-norm projections, each against the
// plain product of the same matrix: the norm with the weight folded into w (a weight of ones: the
// sums of squares in a pass before the stream; the norm with its weight loaded as x streams was
// 7-13% slower and went, docs/perf-history, seventh and fourteenth rounds),
// SwiGLU over [gate; up] (rows F apart), and the folded norm with SwiGLU. If a fused form streams
// as fast as the plain product, the kernel it replaces (a norm, SiLU) is saved outright.
// (Interleaved gate/up rows, each warp's two rows adjacent, streamed no faster than [gate; up]:
// 54.7 against 54.0 us on Llama-3-8B's gate|up, docs/perf-history eleventh round, so they went.)
enum class Fusion { kPlain, kUnitNorm, kSwiGlu, kUnitNormSwiGlu };
constexpr const char* kFusionNames[] = {"plain", "norm (weight folded)", "SwiGLU",
                                        "norm folded + SwiGLU"};

void BM_GemvFusion(benchmark::State& state) {
  // q|k|v of Llama-3-8B, its gate|up, and DeepSeek-V2-Lite's shared-expert gate|up.
  constexpr Shape kFusionShapes[] = {
      {"llama-3-8b q|k|v", 6144, 4096, cuda::GemvEpilogue::kStore},
      {"llama-3-8b gate|up", 28672, 4096, cuda::GemvEpilogue::kStore},
      {"v2-lite shared gate|up", 5632, 2048, cuda::GemvEpilogue::kStore}};
  const Shape& s = kFusionShapes[state.range(0)];
  const auto fusion = static_cast<Fusion>(state.range(1));
  cuda::GemvFusion f;
  f.eps = 1e-5f;
  f.unit_norm = fusion == Fusion::kUnitNorm || fusion == Fusion::kUnitNormSwiGlu;
  const bool swiglu = fusion == Fusion::kSwiGlu || fusion == Fusion::kUnitNormSwiGlu;
  if (swiglu) f.epilogue = cuda::GemvEpilogue::kSwiGlu;
  time_gemv(state, s.m, s.k, swiglu ? s.m / 2 : s.m, f,
            std::string(s.name) + " " + std::to_string(s.m) + "x" + std::to_string(s.k) + ", " +
                kFusionNames[state.range(1)]);
}

void shape_cases(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(kShapes)); ++i)
    for (int64_t split : {0, 1, 2, 4, 8}) b->Args({i, split});
}
BENCHMARK(BM_Gemv)->Apply(shape_cases)->UseManualTime()->Iterations(20);

void fusion_cases(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < 3; ++shape) {
    for (int64_t f = 0; f < static_cast<int64_t>(std::size(kFusionNames)); ++f) {
      // q|k|v has no SwiGLU.
      const bool swiglu = f >= static_cast<int64_t>(Fusion::kSwiGlu);
      if (shape == 0 && swiglu) continue;
      b->Args({shape, f});
    }
  }
}
BENCHMARK(BM_GemvFusion)->Apply(fusion_cases)->UseManualTime()->Iterations(20);

// Decode batches of 2 to 8 on Llama-3-8B's q|k|v and down (the rule's split): the GEMV streams
// the same weights for more rows of x, so GB/s should stay near batch 1's; the kernels for more
// rows hold more registers (fewer blocks an SM), which this shows.
void BM_GemvRows(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const int64_t rows = state.range(1);
  cuda::GemvFusion f;
  f.epilogue = s.epilogue;
  time_gemv(state, s.m, s.k, s.m, f,
            std::string(s.name) + " " + std::to_string(s.m) + "x" + std::to_string(s.k) + ", " +
                std::to_string(rows) + " rows",
            rows);
}
BENCHMARK(BM_GemvRows)
    ->ArgsProduct({{0, 3}, {2, 3, 4, 5, 6, 7, 8}})
    ->UseManualTime()
    ->Iterations(20);

// A decode layer's projections back to back, with nothing between them (the step's attention,
// RoPE and norms left out, as PAGELLM_ABLATE_OPS leaves them out of a step): Llama-3-8B's q|k|v,
// o_proj (+ residual), gate|up with SwiGLU and down (+ residual), or DeepSeek-V2-Lite's q|kv_a,
// o_proj and shared experts, for a number of layers (8 or 32, the second argument) each with its
// own weights (more than the L2 holds; 32 spread them over as many GB as a step's), constant or
// random (the third: 1 for random values, as the dummy checkpoints' weights), replayed from a graph
// with programmatic launch as a decode step runs them. What it measures is the hand-over from one
// projection to the next: the chain's time against its bytes at 4.4 TB/s (what the LM head's long
// GEMV streams), per GEMV. In a Llama-3-8B step the GEMVs alone take ~6 us a projection more than
// their bytes (docs/perf-history, fourteenth round).
struct ChainStep {
  int64_t m, k, out_cols;
  cuda::GemvEpilogue epilogue;
};
constexpr double kStreamRate = 4.4e12;  // bytes/s: the LM head's GEMV alone on the H200

void BM_GemvLayerChain(benchmark::State& state) {
  if (!have_device(state)) return;
  using E = cuda::GemvEpilogue;
  const std::vector<ChainStep> llama = {{6144, 4096, 6144, E::kStore},
                                        {4096, 4096, 4096, E::kAdd},
                                        {28672, 4096, 14336, E::kSwiGlu},
                                        {4096, 14336, 4096, E::kAdd}};
  const std::vector<ChainStep> v2_lite = {{3648, 2048, 3648, E::kStore},
                                          {2048, 2048, 2048, E::kAdd},
                                          {5632, 2048, 2816, E::kSwiGlu},
                                          {2048, 2816, 2048, E::kAdd}};
  const bool is_llama = state.range(0) == 0;
  const int layers = static_cast<int>(state.range(1));
  const bool random = state.range(2) != 0;
  const std::vector<ChainStep>& steps = is_llama ? llama : v2_lite;
  size_t layer_bytes = 0, act = 0;
  for (const ChainStep& c : steps) {
    layer_bytes += static_cast<size_t>(c.m * c.k) * 2;
    act = std::max<size_t>(act, static_cast<size_t>(std::max(c.k, c.out_cols)) * 2);
  }
  void* w = nullptr;
  void* x = nullptr;
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&w, layer_bytes * layers));
  CUDA_CHECK(cudaMalloc(&x, act));
  CUDA_CHECK(cudaMalloc(&out, act));
  if (random) {
    cuda::launch_fill_random(w, DType::kBF16, static_cast<int64_t>(layer_bytes / 2) * layers, 1,
                             -0.05f, 0.05f, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    CUDA_CHECK(cudaMemset(w, 0x3c, layer_bytes * layers));  // finite bf16 values
  }
  CUDA_CHECK(cudaMemset(x, 0x3c, act));
  CUDA_CHECK(cudaMemset(out, 0, act));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto record = [&] {
    char* wl = static_cast<char*>(w);
    for (int l = 0; l < layers; ++l) {
      for (const ChainStep& c : steps) {
        cuda::GemvFusion f;
        f.epilogue = c.epilogue;
        cuda::launch_gemv(cuda::RowView{x, DType::kBF16, 1, c.k, c.k},
                          cuda::RowView{wl, DType::kBF16, c.m, c.k, c.k}, nullptr, DType::kF32,
                          cuda::RowView{out, DType::kBF16, 1, c.out_cols, c.out_cols}, stream, f);
        wl += c.m * c.k * 2;
      }
    }
  };
  const double layer_s = time_replays(state, stream, record, layers) / layers;
  const double n_gemvs = static_cast<double>(steps.size());
  state.counters["us/layer"] = layer_s * 1e6;
  state.counters["TB/s"] = static_cast<double>(layer_bytes) / layer_s * 1e-12;
  state.counters["us/GEMV over"] =
      (layer_s - static_cast<double>(layer_bytes) / kStreamRate) / n_gemvs * 1e6;
  state.SetLabel(std::string(is_llama ? "llama-3-8b q|k|v, o_proj, gate|up, down"
                                      : "v2-lite q|kv_a, o_proj, shared gate|up, shared down") +
                 (random ? ", random weights" : ", constant weights"));
  cudaStreamDestroy(stream);
  cudaFree(w);
  cudaFree(x);
  cudaFree(out);
}
BENCHMARK(BM_GemvLayerChain)
    ->ArgsProduct({{0, 1}, {8, 32}, {0, 1}})
    ->UseManualTime()
    ->Iterations(20);

// The same chains as one persistent launch whose weights stream ahead of its inputs
// (gemv_stream.cu): the first argument picks the model as above, the second how many layers one
// launch runs (1: a launch a layer, as a step with attention between layers would; 2: the most a
// launch's kMaxStreamPhases take). Each layer is norm + q|k|v, o_proj (+ residual), norm + gate|up
// with SwiGLU, down
// (+ residual), so the chain also takes the two norms the GEMV chain above leaves out. The counter
// "max diff" is one layer's residual against the same layer made by launch_gemv (norms included),
// over the largest magnitude: the two add in different orders, so bf16 rounding apart (~1e-2).
void BM_GemvStreamChain(benchmark::State& state) {
  if (!have_device(state)) return;
  using E = cuda::GemvEpilogue;
  const bool is_llama = state.range(0) == 0;
  const int per_launch = static_cast<int>(state.range(1));
  constexpr int kLayers = 32;
  const int64_t hidden = is_llama ? 4096 : 2048, qkv = is_llama ? 6144 : 3648,
                inter = is_llama ? 14336 : 2816;
  const std::vector<ChainStep> steps = {{qkv, hidden, qkv, E::kStore},
                                        {hidden, hidden, hidden, E::kAdd},
                                        {2 * inter, hidden, inter, E::kSwiGlu},
                                        {hidden, inter, hidden, E::kAdd}};
  size_t layer_bytes = 0;
  for (const ChainStep& c : steps) layer_bytes += static_cast<size_t>(c.m * c.k) * 2;
  void *w, *resid, *qkv_buf, *act, *norm_w, *ref_resid;
  unsigned* counter;
  CUDA_CHECK(cudaMalloc(&w, layer_bytes * kLayers));
  CUDA_CHECK(cudaMalloc(&resid, hidden * 2));
  CUDA_CHECK(cudaMalloc(&ref_resid, hidden * 2));
  CUDA_CHECK(cudaMalloc(&qkv_buf, qkv * 2));
  CUDA_CHECK(cudaMalloc(&act, inter * 2));
  CUDA_CHECK(cudaMalloc(&norm_w, hidden * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
  cuda::launch_fill_random(w, DType::kBF16, static_cast<int64_t>(layer_bytes / 2) * kLayers, 1,
                           -0.05f, 0.05f, nullptr);
  cuda::launch_fill_random(resid, DType::kBF16, hidden, 2, -1.0f, 1.0f, nullptr);
  // A norm weight of ones: the phases load it, the one-by-one GEMVs they are compared with
  // normalize with ones (the folded norm, the GEMV's only one).
  cuda::launch_fill_random(norm_w, DType::kF32, hidden, 3, 1.0f, 1.0f, nullptr);
  CUDA_CHECK(cudaMemcpy(ref_resid, resid, hidden * 2, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cuda::StreamPhase> phases;
  char* wl = static_cast<char*>(w);
  for (int l = 0; l < kLayers; ++l) {
    void* const xs[] = {resid, qkv_buf, resid, act};
    void* const outs[] = {qkv_buf, resid, act, resid};
    for (int i = 0; i < 4; ++i) {
      cuda::StreamPhase ph;
      ph.w = wl;
      ph.m = static_cast<int>(steps[i].m);
      ph.k = static_cast<int>(steps[i].k);
      ph.x = xs[i];
      ph.norm_w = i % 2 == 0 ? static_cast<const float*>(norm_w) : nullptr;
      ph.out = outs[i];
      ph.epilogue = steps[i].epilogue;
      if (!cuda::gemv_stream_chain_supported(ph)) {
        state.SkipWithError("shape not supported by the streamed chain");
        return;
      }
      phases.push_back(ph);
      wl += steps[i].m * steps[i].k * 2;
    }
  }
  const auto chain_of = [&](int first_layer, int layers) {
    cuda::StreamChain c;
    for (int i = 0; i < 4 * layers; ++i) c.phase[i] = phases[4 * first_layer + i];
    c.n_phases = 4 * layers;
    return c;
  };
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // One layer both ways, compared.
  cuda::launch_gemv_stream_chain(chain_of(0, 1), counter, 1e-5f, stream);
  {
    const auto row = [](void* p, int64_t n) { return cuda::RowView{p, DType::kBF16, 1, n, n}; };
    char* w0 = static_cast<char*>(w);
    const auto wv = [&](int i) {
      char* p = w0;
      for (int j = 0; j < i; ++j) p += steps[j].m * steps[j].k * 2;
      return cuda::RowView{p, DType::kBF16, steps[i].m, steps[i].k, steps[i].k};
    };
    cuda::GemvFusion f;
    f.unit_norm = true;
    f.eps = 1e-5f;
    cuda::launch_gemv(row(ref_resid, hidden), wv(0), nullptr, DType::kF32, row(qkv_buf, qkv),
                      stream, f);
    cuda::GemvFusion add;
    add.epilogue = E::kAdd;
    cuda::launch_gemv(row(qkv_buf, hidden), wv(1), nullptr, DType::kF32, row(ref_resid, hidden),
                      stream, add);
    f.epilogue = E::kSwiGlu;
    cuda::launch_gemv(row(ref_resid, hidden), wv(2), nullptr, DType::kF32, row(act, inter), stream,
                      f);
    cuda::launch_gemv(row(act, inter), wv(3), nullptr, DType::kF32, row(ref_resid, hidden), stream,
                      add);
  }
  std::vector<uint16_t> a(hidden), b(hidden);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaMemcpy(a.data(), resid, hidden * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), ref_resid, hidden * 2, cudaMemcpyDeviceToHost));
  double max_diff = 0.0, max_mag = 0.0;
  for (int64_t i = 0; i < hidden; ++i) {
    max_diff =
        std::max(max_diff, static_cast<double>(std::fabs(bf16_to_f32(a[i]) - bf16_to_f32(b[i]))));
    max_mag = std::max(max_mag, static_cast<double>(std::fabs(bf16_to_f32(b[i]))));
  }
  const auto record = [&] {
    for (int l = 0; l < kLayers; l += per_launch)
      cuda::launch_gemv_stream_chain(chain_of(l, per_launch), counter, 1e-5f, stream);
  };
  const double layer_s = time_replays(state, stream, record, kLayers) / kLayers;
  state.counters["us/layer"] = layer_s * 1e6;
  state.counters["TB/s"] = static_cast<double>(layer_bytes) / layer_s * 1e-12;
  state.counters["us/GEMV over"] =
      (layer_s - static_cast<double>(layer_bytes) / kStreamRate) / 4.0 * 1e6;
  state.counters["max diff"] = max_diff / std::max(max_mag, 1e-30);
  state.SetLabel(std::string(is_llama ? "llama-3-8b" : "v2-lite") + ", " +
                 std::to_string(per_launch) + " layer(s) a launch");
  cudaStreamDestroy(stream);
  for (void* p : {w, resid, ref_resid, qkv_buf, act, norm_w}) cudaFree(p);
  cudaFree(counter);
}
BENCHMARK(BM_GemvStreamChain)->ArgsProduct({{0, 1}, {1, 2}})->UseManualTime()->Iterations(20);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
