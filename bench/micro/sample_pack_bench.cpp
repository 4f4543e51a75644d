// Host side of device sampling: SampleBatchPacker::pack for one decode step of a 128256-token
// vocabulary, the part of a device-sampled step that runs on the CPU. With penalties every row
// turns its history (a 2048-token prompt and 512 generated tokens, as in sampler_bench) into
// sorted per-token edits; without them a row is a few scalars. Rows are packed on the thread pool
// (PAGELLM_NUM_THREADS) from two rows up.
//   sample_pack_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "sample/sample_batch.h"

namespace pagellm {
namespace {

constexpr int32_t kVocab = 128256;

// Args: batch, penalties (0/1).
void BM_Pack(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const bool penalties = state.range(1) != 0;
  SamplingParams p;
  p.top_k = 50;
  p.top_p = 0.9f;
  if (penalties) {
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.5f;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(2048)),
      outputs(batch, std::vector<int32_t>(512));
  for (auto& v : prompts)
    for (int32_t& t : v) t = token(rng);
  for (auto& v : outputs)
    for (int32_t& t : v) t = token(rng);
  std::vector<SampleRow> rows(batch);
  std::vector<int64_t> logits_rows(batch);
  for (int64_t r = 0; r < batch; ++r) {
    rows[r] = {&p, prompts[r], outputs[r], static_cast<uint64_t>(r)};
    logits_rows[r] = r;
  }
  SamplerConfig c;
  c.vocab_size = kVocab;
  SampleBatchPacker packer(c);
  PackedSampleBatch packed;
  for (auto _ : state) {
    packer.pack(rows, logits_rows, packed);
    benchmark::DoNotOptimize(packed.edits.data());
  }
  state.counters["edits"] = static_cast<double>(packed.edits.size());
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Pack)
    ->Args({1, 0})
    ->Args({256, 0})
    ->Args({1, 1})
    ->Args({64, 1})
    ->Args({256, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
