// Decode attention on the CUDA backend (Backend::attention with one query per sequence): the
// split-KV kernel of src/backend/cuda/attention.cu for the Llama-3-8B head layout (32 query heads,
// 8 KV heads, head_dim 128), and the latent kernel of attention_mla.cu for DeepSeek-V2-Lite's MLA
// (16 query heads over one 576-value latent row per token, V its last 512 values). bf16 q and
// paged cache in 16-token blocks. One case is one layer's call for `seqs` sequences of `ctx`
// cached tokens, planned for `plan` tokens (a decode graph plans for max_model_len and each
// sequence cuts its own context; plan = ctx is an eager step). Reported per call:
//   time          CUDA events around kReps back-to-back calls on the backend's stream, / kReps
//   GB/s          the KV bytes read (each sequence's cache once) over the time
//   us_per_token  the time of one call for every layer of the model (32 or 27), per decode step
//   cuda_attention_decode_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "cuda_bench_util.h"

namespace pagellm {
namespace {

constexpr int64_t kBlock = 16;
constexpr int kReps = 20;

struct Layout {
  const char* name;
  int64_t hq, hkv, d, dv, layers;
  bool latent;  // V is a column view of the K rows (MLA)
};
constexpr Layout kLlama{"llama-3-8b 32q/8kv x 128", 32, 8, 128, 128, 32, false};
constexpr Layout kMla{"deepseek-v2-lite MLA 16q x 576/512", 16, 1, 576, 512, 27, true};

void run_case(benchmark::State& state, const Layout& L) {
  const int32_t seqs = static_cast<int32_t>(state.range(0));
  const int32_t ctx = static_cast<int32_t>(state.range(1));
  const int32_t plan = static_cast<int32_t>(std::max<int64_t>(state.range(2), ctx));
  Backend* be = bench::cuda_or_skip(state);
  if (be == nullptr) return;
  Backend& cuda = *be;
  bench::PagedBatch batch = bench::paged_batch(cuda, seqs, ctx, 1, kBlock, plan);
  const int64_t k_row = L.d, v_row = L.latent ? 0 : L.dv;
  auto q_buf = cuda.allocate(seqs * L.hq * L.d * 2);
  auto out_buf = cuda.allocate(seqs * L.hq * L.dv * 2);
  auto k_buf = cuda.allocate(batch.n_blocks * kBlock * L.hkv * k_row * 2);
  auto v_buf = L.latent ? nullptr : cuda.allocate(batch.n_blocks * kBlock * L.hkv * v_row * 2);
  Tensor q = q_buf->view(DType::kBF16, {seqs, L.hq, L.d});
  Tensor out = out_buf->view(DType::kBF16, {seqs, L.hq, L.dv});
  Tensor k_cache = k_buf->view(DType::kBF16, {batch.n_blocks, kBlock, L.hkv, k_row});
  Tensor v_cache = L.latent ? k_cache.slice_cols(L.d - L.dv, L.d)
                            : v_buf->view(DType::kBF16, {batch.n_blocks, kBlock, L.hkv, v_row});
  cuda.fill_random(q, 1, -1.0f, 1.0f);
  cuda.fill_random(k_cache, 2, -1.0f, 1.0f);
  if (!L.latent) cuda.fill_random(v_cache, 3, -1.0f, 1.0f);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(L.latent ? 192 : L.d));

  const double per_call_s = bench::time_calls(
      cuda, state, kReps, [&] { cuda.attention(q, k_cache, v_cache, batch.meta, params, out); });
  const double kv_bytes =
      static_cast<double>(seqs) * ctx * L.hkv * static_cast<double>(k_row + v_row) * 2.0;
  state.counters["GB/s"] = kv_bytes / per_call_s * 1e-9;
  state.counters["us_per_token"] = per_call_s * static_cast<double>(L.layers) * 1e6;
  state.SetLabel(std::string(L.name) + ", " + std::to_string(seqs) + " x " + std::to_string(ctx) +
                 " tokens, planned for " + std::to_string(plan));
}

void BM_DecodeAttentionLlama(benchmark::State& state) {
  run_case(state, kLlama);
}
void BM_DecodeAttentionMla(benchmark::State& state) {
  run_case(state, kMla);
}

// seqs, ctx, plan: batch 1 eager and as recorded for an 8192-token max_model_len; long contexts;
// the decode batches of the offline runs (Llama-3-8B: up to 512 sequences of ~640 tokens;
// V2-Lite: 200 of ~1050), also as a server's graphs plan them (for Llama-3's 8,192-token and
// Llama-3.1's 131,072-token max_model_len).
#define DECODE_CASES(bm)                  \
  BENCHMARK(bm)                           \
      ->ArgNames({"seqs", "ctx", "plan"}) \
      ->Args({1, 513, 513})               \
      ->Args({1, 513, 8192})              \
      ->Args({1, 4096, 4096})             \
      ->Args({1, 32768, 32768})           \
      ->Args({1, 131072, 131072})         \
      ->Args({64, 1024, 1024})            \
      ->Args({256, 640, 768})             \
      ->Args({512, 640, 768})             \
      ->Args({200, 1050, 1100})           \
      ->Args({256, 640, 8192})            \
      ->Args({512, 640, 8192})            \
      ->Args({64, 1024, 131072})          \
      ->Args({512, 640, 131072})          \
      ->UseManualTime()                   \
      ->MinTime(0.1)                      \
      ->Unit(benchmark::kMicrosecond)

DECODE_CASES(BM_DecodeAttentionLlama);
DECODE_CASES(BM_DecodeAttentionMla);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
