// Prefill attention on the CUDA backend (Backend::attention with max_seqlen_q > 1: the tensor-core
// kernel of src/backend/cuda/attention_prefill.cu) for the Llama-3-8B head layout: 32 query heads,
// 8 KV heads, head_dim 128, bf16 q and paged KV cache in 16-token blocks. One case is one layer's
// attention call over n_seqs fresh prompts of len tokens (no cached prefix), the KV already in
// the cache. Reported per call:
//   time          CUDA events around kReps back-to-back calls on the backend's stream, / kReps
//   TFLOP/s       causal attention FLOPs: 4 * (sum over queries of the keys each sees) * head_dim
//                 * query heads (QK^T and P.V, 2 FLOPs per multiply-add each)
//   ms_32_layers  the time of 32 such calls: one prompt's attention through the whole model
//   cuda_attention_prefill_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_bench_util.h"

namespace pagellm {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kDim = 128, kBlock = 16, kLayers = 32;
constexpr int kReps = 10;  // calls per timed interval: launch gaps hide behind queued work

void BM_PrefillAttention(benchmark::State& state) {
  const int32_t n_seqs = static_cast<int32_t>(state.range(0));
  const int32_t len = static_cast<int32_t>(state.range(1));
  Backend* be = bench::cuda_or_skip(state);
  if (be == nullptr) return;
  Backend& cuda = *be;
  const int64_t n = static_cast<int64_t>(n_seqs) * len;
  bench::PagedBatch batch = bench::paged_batch(cuda, n_seqs, len, len, kBlock, len);
  auto q_buf = cuda.allocate(n * kHq * kDim * 2);
  auto out_buf = cuda.allocate(n * kHq * kDim * 2);
  auto k_buf = cuda.allocate(batch.n_blocks * kBlock * kHkv * kDim * 2);
  auto v_buf = cuda.allocate(batch.n_blocks * kBlock * kHkv * kDim * 2);
  Tensor q = q_buf->view(DType::kBF16, {n, kHq, kDim});
  Tensor out = out_buf->view(DType::kBF16, {n, kHq, kDim});
  Tensor k_cache = k_buf->view(DType::kBF16, {batch.n_blocks, kBlock, kHkv, kDim});
  Tensor v_cache = v_buf->view(DType::kBF16, {batch.n_blocks, kBlock, kHkv, kDim});
  cuda.fill_random(q, 1, -1.0f, 1.0f);
  cuda.fill_random(k_cache, 2, -1.0f, 1.0f);
  cuda.fill_random(v_cache, 3, -1.0f, 1.0f);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));

  const double per_call_s = bench::time_calls(
      cuda, state, kReps, [&] { cuda.attention(q, k_cache, v_cache, batch.meta, params, out); });
  const double flops = 4.0 * static_cast<double>(batch.meta.total_qk_pairs) * kDim * kHq;
  state.counters["TFLOP/s"] = flops / per_call_s * 1e-12;
  state.counters["ms_32_layers"] = per_call_s * kLayers * 1e3;
  state.SetLabel(std::to_string(n_seqs) + " x " + std::to_string(len) + " tokens, 32q/8kv x 128");
}

BENCHMARK(BM_PrefillAttention)
    ->ArgNames({"seqs", "len"})
    ->Args({1, 512})
    ->Args({1, 4096})
    ->Args({8, 1024})
    ->Args({1, 16384})
    ->Args({1, 32768})
    ->UseManualTime()
    // Manual time counts one call of the kReps an iteration makes: 0.1 s of it is ~1 s of wall.
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
