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

namespace pagellm {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kDim = 128, kBlock = 16, kLayers = 32;
constexpr int kReps = 10;  // calls per timed interval: launch gaps hide behind queued work

Backend* cuda_or_null(std::string& why) {
  static std::unique_ptr<Backend> backend;
  static std::string status;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto r = make_cuda_backend(0);
    if (r.ok()) backend = std::move(r).value();
    else status = r.status().to_string();
  }
  why = status;
  return backend.get();
}

void BM_PrefillAttention(benchmark::State& state) {
  const int32_t n_seqs = static_cast<int32_t>(state.range(0));
  const int32_t len = static_cast<int32_t>(state.range(1));
  std::string why;
  Backend* be = cuda_or_null(why);
  if (be == nullptr) {
    state.SkipWithError(("CUDA backend unavailable: " + why).c_str());
    return;
  }
  Backend& cuda = *be;
  const int64_t n = static_cast<int64_t>(n_seqs) * len;
  const int64_t blocks_per_seq = (len + kBlock - 1) / kBlock;
  const int64_t n_blocks = n_seqs * blocks_per_seq;

  auto q_buf = cuda.allocate(n * kHq * kDim * 2);
  auto out_buf = cuda.allocate(n * kHq * kDim * 2);
  auto k_buf = cuda.allocate(n_blocks * kBlock * kHkv * kDim * 2);
  auto v_buf = cuda.allocate(n_blocks * kBlock * kHkv * kDim * 2);
  Tensor q = q_buf->view(DType::kBF16, {n, kHq, kDim});
  Tensor out = out_buf->view(DType::kBF16, {n, kHq, kDim});
  Tensor k_cache = k_buf->view(DType::kBF16, {n_blocks, kBlock, kHkv, kDim});
  Tensor v_cache = v_buf->view(DType::kBF16, {n_blocks, kBlock, kHkv, kDim});
  cuda.fill_random(q, 1, -1.0f, 1.0f);
  cuda.fill_random(k_cache, 2, -1.0f, 1.0f);
  cuda.fill_random(v_cache, 3, -1.0f, 1.0f);

  // Sequence s owns blocks s * blocks_per_seq ...: the layout a fresh pool hands out.
  std::vector<int32_t> cu(n_seqs + 1), lens(n_seqs, len), table(n_blocks);
  for (int32_t s = 0; s <= n_seqs; ++s) cu[s] = s * len;
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
  auto cu_buf = cuda.allocate(static_cast<int64_t>(cu.size()) * 4);
  auto lens_buf = cuda.allocate(static_cast<int64_t>(lens.size()) * 4);
  auto table_buf = cuda.allocate(static_cast<int64_t>(table.size()) * 4);
  cuda.copy_from_host(cu_buf->data(), cu.data(), static_cast<int64_t>(cu.size()) * 4);
  cuda.copy_from_host(lens_buf->data(), lens.data(), static_cast<int64_t>(lens.size()) * 4);
  cuda.copy_from_host(table_buf->data(), table.data(), static_cast<int64_t>(table.size()) * 4);

  AttentionMeta meta;
  meta.n_seqs = n_seqs;
  meta.cu_seqlens_q = cu_buf->view(DType::kI32, {n_seqs + 1});
  meta.seq_lens_kv = lens_buf->view(DType::kI32, {n_seqs});
  meta.block_tables = table_buf->view(DType::kI32, {n_seqs, blocks_per_seq});
  meta.block_size = static_cast<int32_t>(kBlock);
  meta.max_seqlen_q = len;
  meta.max_seqlen_kv = len;
  const int64_t pairs = static_cast<int64_t>(n_seqs) * len * (len + 1) / 2;  // causal (query, key)
  meta.total_kv_tokens = n;
  meta.total_qk_pairs = pairs;
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));

  for (int i = 0; i < 3; ++i) cuda.attention(q, k_cache, v_cache, meta, params, out);  // warm-up
  cuda.synchronize();

  auto timer = cuda.make_op_timer();
  double total_s = 0.0;
  for (auto _ : state) {
    timer->reset();
    const int a = timer->mark();
    for (int r = 0; r < kReps; ++r) cuda.attention(q, k_cache, v_cache, meta, params, out);
    const int b = timer->mark();
    cuda.synchronize();
    const double s = timer->elapsed_ms(a, b) / 1e3 / kReps;
    state.SetIterationTime(s);
    total_s += s;
  }
  const double flops = 4.0 * static_cast<double>(pairs) * kDim * kHq;
  const double per_call_s = total_s / static_cast<double>(state.iterations());
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
