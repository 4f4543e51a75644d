// The engine's host work per step with the device taken out: a backend that reports itself as a
// GPU, whose ops do nothing and whose sampler answers at once, under a published model shape
// (random weights of bench/model-configs, never made: buffers are bare addresses). What is left
// is what the GPU waits for between two steps of a synchronous engine: scheduling, block tables,
// the step's metadata, the model's host-side preparation (RoPE tables), packing the sampling rows,
// stop checks and output events. `batch` requests of 512 prompt tokens and 64 generated tokens
// (ignore_eos) run together, prefills chunked at 8192 tokens, as bench throughput runs them.
//   engine_host_bench [--benchmark_filter=...]
// Counters: us_per_step (wall time over the engine's steps) and steps.
#include <benchmark/benchmark.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/engine.h"

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
                     Tensor&) override {}
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
  void sample(const Tensor&, const DeviceSampleInputs& in, DeviceSampleResult* out) override {
    for (int32_t i = 0; i < in.n_rows; ++i) {
      out[i] = DeviceSampleResult{};
      out[i].token = 1000 + i;
    }
  }
  void take_sampled_tokens(Tensor&, uint64_t) override {}  // no tokens on a null device

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
};

// Args: concurrent requests.
void BM_EngineHostStep(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  auto ckpt = open_dummy_checkpoint(std::string(PAGELLM_SOURCE_DIR) +
                                    "/bench/model-configs/llama-3-8b.json");
  if (!ckpt.ok()) return state.SkipWithError(ckpt.status().to_string().c_str());
  NullDeviceBackend backend;
  auto model = load_model(*ckpt, backend);
  if (!model.ok()) return state.SkipWithError(model.status().to_string().c_str());
  EngineConfig cfg;
  cfg.scheduler.max_num_seqs = std::max(batch, 1);
  cfg.scheduler.max_num_batched_tokens = 8192;
  cfg.scheduler.max_waiting = batch;
  cfg.kv_cache_memory = int64_t{40} << 30;
  cfg.max_model_len = 512 + 64;
  auto engine = Engine::create(**model, backend, nullptr, cfg);
  if (!engine.ok()) return state.SkipWithError(engine.status().to_string().c_str());
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
  }
  int64_t steps = 0;
  double seconds = 0;
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
}
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
