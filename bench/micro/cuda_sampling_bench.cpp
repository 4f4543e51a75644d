// Device sampling (Backend::sample on the CUDA backend) for one decode step of a Llama-3-sized
// vocabulary (128256, bf16 logits as the model leaves them) at batch 1 and 256. The time is what
// the engine pays per step: the rows' upload, the kernel, the results' download and the wait.
// Reported: microseconds per step (the benchmark time) and the GB/s of logits that implies (each
// row read at least once; most modes make 2-5 passes, served mostly from L2). BM_HostPath is the
// path the device sampler replaces, for the same step: bf16 -> f32 on the device, the copy to the
// host, the CPU Sampler on every core.
// Logits are "peaked" like a real model's (N(0, 2) plus 32 tokens raised by 8-16; top-p 0.9 then
// keeps a few dozen tokens), or "flat" (N(0, 2) only: top-p's nucleus is tens of thousands).
//   cuda_sampling_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "sample/sample_batch.h"
#include "sample/sampler.h"

namespace pagellm {
namespace {

constexpr int32_t kVocab = 128256;

Backend* device() {
  static std::unique_ptr<Backend> b = [] {
    auto r = make_cuda_backend(0);
    if (!r.ok()) {
      std::fprintf(stderr, "cuda_sampling_bench: %s\n", r.status().to_string().c_str());
      return std::unique_ptr<Backend>();
    }
    return std::move(r).value();
  }();
  return b.get();
}

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

enum Mode {
  kGreedy,
  kTopKTopP,
  kTemperature,
  kTopP,
  kFlatTopP,
  kMinP,
  kLogprobs,
  kPenalties,
  kGrammar
};
const char* const kModeNames[] = {"greedy",    "topk50_topp0.9", "temperature",
                                  "topp0.9",   "flat_topp0.9",   "minp0.05",
                                  "logprobs5", "penalties",      "grammar_topp0.9"};

SamplingParams params_for(Mode mode) {
  SamplingParams p;
  switch (mode) {
    case kGreedy:
      p.temperature = 0.0f;
      break;
    case kTopKTopP:
      p.top_k = 50, p.top_p = 0.9f;
      break;
    case kTemperature:
      p.temperature = 0.7f;
      break;
    case kTopP:
    case kFlatTopP:
    case kGrammar:
      p.top_p = 0.9f;
      break;
    case kMinP:
      p.min_p = 0.05f;
      break;
    case kLogprobs:
      p.top_k = 50, p.top_p = 0.9f, p.logprobs = 5;
      break;
    case kPenalties:
      p.top_k = 50, p.top_p = 0.9f;
      p.repetition_penalty = 1.1f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.5f;
      break;
  }
  return p;
}

// One step's inputs: bf16 logits on the device and the rows (a 2048-token prompt and 512 generated
// tokens per row for the penalties; for the grammar, a mask per row allowing a random quarter
// of the vocabulary, as a JSON string's body does).
struct Step {
  std::unique_ptr<Buffer> logits;
  Tensor logits_t;
  std::vector<float> host;  // f32, for the host path's reference shape
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  std::vector<SampleRow> rows;
  std::vector<int64_t> logits_rows;
  std::vector<std::vector<uint32_t>> masks;

  Step(Backend& be, Mode mode, int64_t batch) {
    host = make_logits(batch, mode != kFlatTopP);
    std::vector<uint16_t> bits(host.size());
    for (size_t i = 0; i < host.size(); ++i) bits[i] = f32_to_bf16(host[i]);
    logits = be.allocate(static_cast<int64_t>(bits.size()) * 2);
    be.copy_from_host(logits->data(), bits.data(), static_cast<int64_t>(bits.size()) * 2);
    logits_t = Tensor(logits->data(), DType::kBF16, {batch, kVocab}, Device::kCuda);
    params = params_for(mode);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
    prompt.resize(2048);
    output.resize(512);
    for (int32_t& t : prompt) t = token(rng);
    for (int32_t& t : output) t = token(rng);
    rows.resize(batch);
    logits_rows.resize(batch);
    for (int64_t r = 0; r < batch; ++r) {
      rows[r].params = &params;
      rows[r].seed = static_cast<uint64_t>(r);
      logits_rows[r] = r;
      if (mode == kPenalties) {
        rows[r].prompt_tokens = prompt;
        rows[r].output_tokens = output;
      }
    }
    if (mode == kGrammar) {
      masks.assign(batch, std::vector<uint32_t>((kVocab + 31) / 32));
      for (int64_t r = 0; r < batch; ++r) {
        for (uint32_t& w : masks[r])
          w = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
        rows[r].allowed = masks[r];
      }
    }
  }
};

SamplerConfig config() {
  SamplerConfig c;
  c.vocab_size = kVocab;
  return c;
}

// Args: mode, batch, blocks per row (0: the backend's choice).
void BM_DeviceSample(benchmark::State& state) {
  Backend* be = device();
  if (be == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  auto* cb = dynamic_cast<cuda::CudaBackend*>(be);
  const Mode mode = static_cast<Mode>(state.range(0));
  const int64_t batch = state.range(1);
  const int group = static_cast<int>(state.range(2));
  Step step(*be, mode, batch);
  SampleBatchPacker packer(config());
  PackedSampleBatch packed;
  std::vector<DeviceSampleResult> res(batch);
  std::vector<SampleOutput> out(batch);
  for (auto _ : state) {
    // Packing is part of the step: the penalties' edits are rebuilt from the histories each time.
    packer.pack(step.rows, step.logits_rows, packed);
    cb->sample_with_group(step.logits_t, packed.inputs(), res.data(), group);
    SampleBatchPacker::unpack(packed, res, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(kModeNames[mode]) + (group ? " group=" + std::to_string(group) : ""));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(batch) * kVocab * 2,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// The replaced path: convert to f32 on the device, copy to the host, sample on the CPU.
void BM_HostPath(benchmark::State& state) {
  Backend* be = device();
  if (be == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const Mode mode = static_cast<Mode>(state.range(0));
  const int64_t batch = state.range(1);
  Step step(*be, mode, batch);
  auto f32 = be->allocate(batch * kVocab * 4);
  Tensor f32_t(f32->data(), DType::kF32, {batch, kVocab}, Device::kCuda);
  std::vector<float> host(batch * kVocab);
  Sampler sampler(config());
  std::vector<SampleOutput> out(batch);
  for (auto _ : state) {
    be->to_f32(step.logits_t, f32_t);
    be->copy_to_host(host.data(), f32->data(), batch * kVocab * 4);
    Status s = sampler.sample(Tensor(host.data(), DType::kF32, {batch, kVocab}), step.rows, out);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(kModeNames[mode]);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(batch) * kVocab * 2,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void DeviceArgs(benchmark::internal::Benchmark* b) {
  for (int mode : {kGreedy, kTopKTopP})
    for (int batch : {1, 256}) b->Args({mode, batch, 0});
  b->Args({kGreedy, 1, 1});  // batch 1 on one block, against the cluster above
  b->Args({kTopKTopP, 1, 1});
  for (int mode : {kTemperature, kTopP, kFlatTopP, kMinP, kLogprobs, kPenalties, kGrammar})
    for (int batch : {1, 256}) b->Args({mode, batch, 0});
  b->Args({kTopKTopP, 32, 0});
}

BENCHMARK(BM_DeviceSample)->Apply(DeviceArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HostPath)
    ->Args({kGreedy, 1})
    ->Args({kTopKTopP, 1})
    ->Args({kGreedy, 256})
    ->Args({kTopKTopP, 256})
    ->Args({kGrammar, 1})
    ->Args({kGrammar, 256})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
