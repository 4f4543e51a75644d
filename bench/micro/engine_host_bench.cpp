// The engine's host work per step with the device taken out: a backend that reports itself as a
// GPU, whose ops do nothing and whose sampler answers at once, under a published model shape
// (random weights of bench/model-configs, never made: buffers are bare addresses). What is left
// is what the GPU waits for between two steps of a synchronous engine: scheduling, block tables,
// the step's metadata, the model's host-side preparation (RoPE tables), packing the sampling rows,
// stop checks and output events. `batch` requests of 512 prompt tokens and 64 generated tokens
// (ignore_eos) run together, prefills chunked at 8192 tokens, as bench throughput runs them.
// BM_EngineHostStepJsonSchema binds every request to bench/schemas/order.json (the Llama-3 test
// tokenizer, masks over all 128,256 ids), the null sampler picking a random allowed token: the
// grammars' share of the host work (their masks, their accepts, the masks' copies).
//   engine_host_bench [--benchmark_filter=...]
// Counters: us_per_step (wall time over the engine's steps) and steps.
#include <benchmark/benchmark.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/grammar.h"
#include "tokenizer/tokenizer.h"

// The repository root, for bench/model-configs (run from there, or define it at build time).
#ifndef PAGELLM_SOURCE_DIR
#define PAGELLM_SOURCE_DIR "."
#endif

namespace pagellm {
namespace {

// A device allocation that is only an address: nothing reads or writes through it.
class AddressBuffer final : public Buffer {
 public:
  AddressBuffer(uintptr_t at, int64_t n) : at_(at), n_(n) {}
  void* data() const override { return reinterpret_cast<void*>(at_); }
  int64_t nbytes() const override { return n_; }
  Device device() const override { return Device::kCuda; }

 private:
  uintptr_t at_;
  int64_t n_;
};

class NullDeviceBackend final : public Backend {
 public:
  std::string name() const override { return "null device"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }
  std::unique_ptr<Buffer> allocate(int64_t n) override {
    const uintptr_t at = next_;
    next_ += (static_cast<uintptr_t>(n) + 255) / 256 * 256 + 256;
    return std::make_unique<AddressBuffer>(at, n);
  }
  int64_t free_memory() const override { return int64_t{80} << 30; }
  void copy_from_host(void*, const void*, int64_t) override {}
  void copy_to_host(void* dst, const void*, int64_t n) override { std::memset(dst, 0, n); }
  void copy(void*, const void*, int64_t) override {}
  void synchronize() override {}
  Result<Tensor> upload_weight(const Tensor& host, DType dtype,
                               std::unique_ptr<Buffer>& s) override {
    s = allocate(dtype_bytes(dtype, host.numel()));
    Tensor t = host;
    t.data = s->data();
    t.dtype = dtype;
    t.device = Device::kCuda;
    return t;
  }
  void embedding(const Tensor&, const Tensor&, Tensor&) override {}
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override {}
  void add_rms_norm(const Tensor&, Tensor&, const Tensor&, float, Tensor&) override {}
  void matmul(const Tensor&, const Tensor&, const Tensor&, Tensor&) override {}
  void batched_matmul(const Tensor&, const Tensor&, Tensor&) override {}
  void rope_store_kv(Tensor&, Tensor&, const Tensor&, const Tensor&, bool, const Tensor&, Tensor&,
                     Tensor&, float, float) override {}
  void rope(Tensor&, const Tensor&, bool) override {}
  void attention(const Tensor&, const Tensor&, const Tensor&, const AttentionMeta&,
                 const AttentionParams&, Tensor&) override {}
  void silu_mul(const Tensor&, const Tensor&, Tensor&) override {}
  void add(const Tensor&, const Tensor&, Tensor&) override {}
  void gather_rows(const Tensor&, const Tensor&, Tensor&) override {}
  void to_f32(const Tensor&, Tensor&) override {}
  void fill_random(Tensor&, uint64_t, float, float) override {}
  void moe_route(const Tensor&, const Tensor&, const MoeRouteParams&, Tensor&, Tensor&) override {}
  void moe_experts(const Tensor&, const Tensor&, const Tensor&, const MoeExpertWeights&,
                   const Tensor&, Tensor&) override {}
  bool supports_sampling() const override { return true; }
  // A row's token: 1000 + its index, or under a grammar a random token its mask allows.
  void sample(const Tensor&, const DeviceSampleInputs& in, DeviceSampleResult* out) override {
    for (int32_t i = 0; i < in.n_rows; ++i) {
      out[i] = DeviceSampleResult{};
      out[i].token = 1000 + i;
      const int64_t m = in.rows[i].mask_word;
      if (m < 0) continue;
      // From a random word on, the first word with an allowed token, and a random one of its
      // bits (not uniform over the tokens, but cheap, as a device sampler's cost is not the
      // host's).
      const int64_t start = std::uniform_int_distribution<int64_t>(0, mask_words_ - 1)(rng_);
      for (int64_t k = 0; k < mask_words_; ++k) {
        const int64_t w = (start + k) % mask_words_;
        uint32_t bits = in.masks[m + w];
        if (bits == 0) continue;
        for (int skip = static_cast<int>(rng_() % __builtin_popcount(bits)); skip > 0; --skip)
          bits &= bits - 1;
        out[i].token = static_cast<int32_t>(w * 32 + __builtin_ctz(bits));
        break;
      }
    }
  }
  void set_vocab_size(int64_t v) { mask_words_ = (v + 31) / 32; }
  void take_sampled_tokens(Tensor&, uint64_t) override {}  // no tokens on a null device

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
  int64_t mask_words_ = 0;
  std::mt19937_64 rng_{7};
};

// `batch` concurrent requests, each bound to `schema` (a file under the repository) unless empty.
void run_engine_host_steps(benchmark::State& state, int32_t batch, const std::string& schema) {
  auto ckpt = open_dummy_checkpoint(std::string(PAGELLM_SOURCE_DIR) +
                                    "/bench/model-configs/llama-3-8b.json");
  if (!ckpt.ok()) return state.SkipWithError(ckpt.status().to_string().c_str());
  NullDeviceBackend backend;
  auto model = load_model(*ckpt, backend);
  if (!model.ok()) return state.SkipWithError(model.status().to_string().c_str());
  backend.set_vocab_size((*model)->config().vocab_size);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!schema.empty()) {
    auto t = load_tokenizer(std::string(PAGELLM_SOURCE_DIR) + "/tests/data/tokenizer/llama3");
    if (!t.ok()) return state.SkipWithError(t.status().to_string().c_str());
    tokenizer = std::move(*t);
  }
  EngineConfig cfg;
  cfg.scheduler.max_num_seqs = std::max(batch, 1);
  cfg.scheduler.max_num_batched_tokens = 8192;
  cfg.scheduler.max_waiting = batch;
  cfg.kv_cache_memory = int64_t{40} << 30;
  cfg.max_model_len = 512 + 64;
  auto engine = Engine::create(**model, backend, tokenizer.get(), cfg);
  if (!engine.ok()) return state.SkipWithError(engine.status().to_string().c_str());
  std::shared_ptr<const CompiledGrammar> grammar;
  if (!schema.empty()) {
    std::ifstream f(std::string(PAGELLM_SOURCE_DIR) + "/" + schema);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto g = (*engine)->grammars()->compile({GrammarKind::kJsonSchema, text});
    if (!g.ok()) return state.SkipWithError(g.status().to_string().c_str());
    grammar = *g;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(100, 128000);
  std::vector<EngineRequest> reqs(batch);
  for (EngineRequest& r : reqs) {
    r.prompt.resize(512);
    for (int32_t& t : r.prompt) t = tok(rng);
    r.params.max_tokens = 64;
    r.params.temperature = 1.0f;
    r.params.ignore_eos = true;
    r.detokenize = false;
    r.grammar = grammar;
  }
  int64_t steps = 0;
  double seconds = 0;
  const double mask_s0 = (*engine)->stats().grammar_mask_seconds;
  for (auto _ : state) {
    std::mutex mu;
    std::condition_variable cv;
    int32_t done = 0;
    const int64_t steps0 = (*engine)->stats().steps;
    const auto t0 = std::chrono::steady_clock::now();
    for (const EngineRequest& r : reqs) {
      auto id = (*engine)->submit(r, [&](EngineOutput&& o) {
        if (!o.request_done) return;
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        cv.notify_all();
      });
      if (!id.ok()) return state.SkipWithError(id.status().to_string().c_str());
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == batch; });
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    steps += (*engine)->stats().steps - steps0;
  }
  state.counters["steps"] = static_cast<double>(steps) / static_cast<double>(state.iterations());
  state.counters["us_per_step"] = steps > 0 ? 1e6 * seconds / static_cast<double>(steps) : 0.0;
  if (grammar) {  // of which the grammars' masks
    const double mask_s = (*engine)->stats().grammar_mask_seconds - mask_s0;
    state.counters["mask_us_per_step"] = steps > 0 ? 1e6 * mask_s / static_cast<double>(steps) : 0;
  }
}

// Args: concurrent requests.
void BM_EngineHostStep(benchmark::State& state) {
  run_engine_host_steps(state, static_cast<int32_t>(state.range(0)), "");
}
void BM_EngineHostStepJsonSchema(benchmark::State& state) {
  run_engine_host_steps(state, static_cast<int32_t>(state.range(0)), "bench/schemas/order.json");
}
BENCHMARK(BM_EngineHostStepJsonSchema)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_EngineHostStep)
    ->Arg(1)
    ->Arg(64)
    ->Arg(256)
    ->Arg(512)  // the offline runs' max-num-seqs
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace pagellm

BENCHMARK_MAIN();
