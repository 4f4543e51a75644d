// CPU matmul kernels: decode GEMV (n = 1) per weight dtype, in GB/s of weights streamed, and the
// prefill GEMM (n = 128) in FLOP/s. "hot" repeats one weight matrix (it may sit in the last-level
// cache); "cold" rotates through copies totalling >= 1 GiB so every pass comes from DRAM, which is
// what decode of a real model sees. BM_ReadBandwidth is the ceiling to compare GB/s against.
//   cpu_matmul_bench [--benchmark_filter=...]   threads: PAGELLM_NUM_THREADS (default: all)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/memory_bandwidth.h"
#include "core/dtype.h"
#include "core/kquants.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace pagellm {
namespace {

constexpr DType kDtypes[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0, DType::kQ4_0,
                             DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K};
constexpr int kNumDtypes = static_cast<int>(sizeof(kDtypes) / sizeof(kDtypes[0]));

// Random blocks of a type pagellm reads but does not write (Q5_0 and the k-quants come from
// llama.cpp's quantizer): random bytes, with every f16 block scale (d, and Q4_K's dmin) set to
// 0.01 so that the products stay finite. The kernels' speed does not depend on the values.
void random_blocks(DType t, int64_t n_values, std::vector<uint8_t>& out, std::mt19937& rng) {
  out.resize(dtype_bytes(t, n_values));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  const uint16_t d = f32_to_f16(0.01f);
  const int64_t bytes = block_bytes(t), n_blocks = n_values / block_elems(t);
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* b = out.data() + i * bytes;
    if (t == DType::kQ6_K) {
      std::memcpy(b + bytes - 2, &d, 2);  // d last
    } else {
      std::memcpy(b, &d, 2);  // d first (Q5_0, Q4_K), then Q4_K's dmin
      if (t == DType::kQ4_K) std::memcpy(b + 2, &d, 2);
    }
  }
}

// One quantized/converted weight matrix, replicated `copies` times back to back.
struct Weights {
  std::vector<uint8_t> bytes;
  int64_t matrix_bytes = 0;
  int copies = 1;
  Weights(DType t, int64_t m, int64_t k, bool cold) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> wf(m * k);
    for (auto& v : wf) v = dist(rng);
    matrix_bytes = dtype_bytes(t, m * k);
    copies = cold ? static_cast<int>(((int64_t{1} << 30) + matrix_bytes - 1) / matrix_bytes) : 1;
    bytes.resize(matrix_bytes * copies);
    if (t == DType::kQ5_0 || is_kquant(t)) {
      std::vector<uint8_t> one;
      random_blocks(t, m * k, one, rng);
      std::memcpy(bytes.data(), one.data(), matrix_bytes);
    } else {
      from_f32(t, wf.data(), bytes.data(), m * k);
    }
    for (int c = 1; c < copies; ++c)
      std::memcpy(bytes.data() + c * matrix_bytes, bytes.data(), matrix_bytes);
  }
  Tensor matrix(DType t, int64_t m, int64_t k, int index) {
    return Tensor(bytes.data() + (index % copies) * matrix_bytes, t, {m, k});
  }
};

// Args: dtype index, M, K, n, cold.
void run_matmul(benchmark::State& state) {
  const DType t = kDtypes[state.range(0)];
  const int64_t m = state.range(1), k = state.range(2), n = state.range(3);
  const bool cold = state.range(4) != 0;
  auto be = make_cpu_backend(true);
  Weights w(t, m, k, cold);
  std::vector<float> x(n * k, 0.5f), out(n * m);
  Tensor xt(x.data(), DType::kF32, {n, k}), ot(out.data(), DType::kF32, {n, m});
  int i = 0;
  for (auto _ : state) {
    be->matmul(xt, w.matrix(t, m, k, i++), Tensor(), ot);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * w.matrix_bytes);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * m * k * state.iterations(),
                                                benchmark::Counter::kIsRate);
  state.SetLabel(std::string(dtype_name(t)) + (cold ? " cold" : " hot") + " " + be->name() +
                 " threads=" + std::to_string(ThreadPool::global().n_threads()));
}

void gemv_args(benchmark::internal::Benchmark* b) {
  for (int cold : {0, 1})
    for (int64_t m : {2048, 8192})
      for (int d = 0; d < kNumDtypes; ++d) b->Args({d, m, 2048, 1, cold});
}
BENCHMARK(run_matmul)->Name("BM_Gemv")->Apply(gemv_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int d = 0; d < kNumDtypes; ++d) b->Args({d, 2048, 2048, 128, 0});
}
BENCHMARK(run_matmul)->Name("BM_Gemm")->Apply(gemm_args)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_ReadBandwidth(benchmark::State& state) {
  double gbs = 0;
  for (auto _ : state) gbs = measure_read_bandwidth_gbs();
  state.counters["GB/s"] = gbs;
}
BENCHMARK(BM_ReadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
