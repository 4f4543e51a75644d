// CPU sampler: one decode step's sampling for a Llama-3-sized vocabulary (128256) at batch 1 and
// 64, per sampling mode. Reported: rows/s and GB/s of logits read (vocab * 4 bytes per row, read
// at least once; most modes make 2-4 passes). Logits are "peaked" like a real model's: N(0, 2)
// noise plus 32 tokens raised by 8-16, so top-p keeps a realistic few dozen tokens; the "flat"
// variant (pure N(0, 2)) is top-p's worst case, a nucleus of tens of thousands of tokens.
//   sampler_bench [--benchmark_filter=...]   threads: PAGELLM_NUM_THREADS (default: all)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "sample/sampler.h"

namespace pagellm {
namespace {

constexpr int32_t kVocab = 128256;

std::vector<float> make_logits(int64_t rows, bool peaked) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::uniform_real_distribution<float> boost(8.0f, 16.0f);
  std::vector<float> logits(rows * kVocab);
  for (float& v : logits) v = noise(rng);
  if (peaked)
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < 32; ++j) logits[r * kVocab + token(rng)] += boost(rng);
  return logits;
}

enum Mode { kGreedy, kTemperature, kTopK, kTopP, kTopKTopP, kMinP, kLogprobs, kPenalties, kFlatTopP };

SamplingParams params_for(Mode mode) {
  SamplingParams p;
  switch (mode) {
    case kGreedy: p.temperature = 0.0f; break;
    case kTemperature: p.temperature = 0.7f; break;
    case kTopK: p.top_k = 50; break;
    case kTopP:
    case kFlatTopP: p.top_p = 0.9f; break;
    case kTopKTopP: p.top_k = 50; p.top_p = 0.9f; break;
    case kMinP: p.min_p = 0.05f; break;
    case kLogprobs: p.top_k = 50; p.top_p = 0.9f; p.logprobs = 5; break;
    case kPenalties:
      p.top_k = 50;
      p.top_p = 0.9f;
      p.repetition_penalty = 1.1f;
      p.frequency_penalty = 0.5f;
      p.presence_penalty = 0.5f;
      break;
  }
  return p;
}

// Args: mode, batch.
void BM_Sample(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  const int64_t batch = state.range(1);
  std::vector<float> logits = make_logits(batch, mode != kFlatTopP);
  const SamplingParams params = params_for(mode);
  // Penalties see a 2048-token prompt and 512 generated tokens per row.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::vector<int32_t> prompt(2048), output(512);
  for (int32_t& t : prompt) t = token(rng);
  for (int32_t& t : output) t = token(rng);
  std::vector<SampleRow> rows(batch);
  for (int64_t r = 0; r < batch; ++r) {
    rows[r].params = &params;
    rows[r].seed = static_cast<uint64_t>(r);
    if (mode == kPenalties) {
      rows[r].prompt_tokens = prompt;
      rows[r].output_tokens = output;
    }
  }
  SamplerConfig config;
  config.vocab_size = kVocab;
  config.eos_token_ids = {128001, 128009};
  Sampler sampler(config);
  std::vector<SampleOutput> out(batch);
  Tensor t(logits.data(), DType::kF32, {batch, kVocab});
  for (auto _ : state) {
    Status st = sampler.sample(t, rows, out);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(state.iterations() * batch * kVocab * int64_t{sizeof(float)});
}

void register_all() {
  const char* names[] = {"greedy", "temperature", "top_k50",    "top_p0.9",  "top_k50_top_p0.9",
                         "min_p0.05", "top_k50_top_p0.9_logprobs5", "penalties_top_k50_top_p0.9",
                         "flat_top_p0.9"};
  for (int mode = kGreedy; mode <= kFlatTopP; ++mode)
    for (int64_t batch : {1, 64})
      benchmark::RegisterBenchmark(
          (std::string("BM_Sample/") + names[mode] + "/batch:" + std::to_string(batch)).c_str(),
          BM_Sample)
          ->Args({mode, batch})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
}

}  // namespace
}  // namespace pagellm

int main(int argc, char** argv) {
  pagellm::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
