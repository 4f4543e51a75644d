// An FP8 KV cache (--kv-cache-dtype fp8) against the f32 one on the golden fixtures (tiny random
// Llama, Qwen2, Mistral, Mixtral, DeepSeek-V2 and -V3 with MLA's latent cache): the bytes a token
// costs (a quarter of f32's), how often the two caches agree on the most likely next token over
// the prompts and how far the prompt tokens' logprobs move (printed; bounded loosely: e4m3 keeps
// 3 mantissa bits), and that an FP8 engine is deterministic through prefix caching and
// preemption (the same tokens as with room for everything).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine_test_util.h"
#include "forwarding_backend.h"
#include "io/weights.h"
#include "runtime/engine.h"
#include "source_dir.h"

namespace pagellm {
namespace {

struct RunResult {
  std::vector<Collected> out;
  EngineStats stats;
};

RunResult run(Model& model, Backend& backend, const std::vector<EngineRequest>& reqs, bool fp8,
              int64_t kv_bytes) {
  EngineConfig cfg;
  cfg.scheduler.max_num_seqs = 8;
  cfg.scheduler.max_num_batched_tokens = 48;
  cfg.scheduler.paranoid = true;
  cfg.kv_cache_memory = kv_bytes;
  cfg.fp8_kv_cache = fp8;
  auto e = Engine::create(model, backend, nullptr, cfg);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  RunResult r;
  r.out.resize(reqs.size());
  if (!e.ok()) return r;
  Waiter w;
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_TRUE((*e)->submit(reqs[i], w.callback(&r.out[i])).ok());
  w.wait(static_cast<int>(reqs.size()));
  (*e)->shutdown();
  r.stats = (*e)->stats();
  EXPECT_EQ(r.stats.scheduler.kv_usage, 0.0);
  return r;
}

std::vector<EngineRequest> requests(uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> shared = random_prompt(rng, 20);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy_request(random_prompt(rng, 4 + 3 * i), 16, 1);
    // The last three start with the same 20 tokens: a whole block of prefix hits each.
    if (i >= 3) r.prompt.insert(r.prompt.begin(), shared.begin(), shared.end());
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(EngineFp8Kv, AgainstTheF32CacheOnTheGoldenFixtures) {
  auto backend = make_cpu_backend(true);
  for (const char* name : {"llama", "qwen2", "mistral", "mixtral", "deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(name);
    auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/" + name);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    auto model = load_model(*ckpt, *backend);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    // Teacher-forced: every prompt position's most likely next token and the logprob of the
    // prompt's own, with each cache (the prompts are long enough to read back many FP8 rows).
    std::vector<EngineRequest> reqs = requests(31);
    for (EngineRequest& r : reqs) r.params.prompt_logprobs = 1;
    const RunResult f32 = run(**model, *backend, reqs, false, 8 << 20);
    const RunResult fp8 = run(**model, *backend, reqs, true, 2 << 20);
    EXPECT_EQ(fp8.stats.kv_block_bytes * 4, f32.stats.kv_block_bytes);
    int64_t agree = 0, positions = 0;
    double err = 0, worst = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& a = f32.out[i].prompt_logprobs;
      const auto& b = fp8.out[i].prompt_logprobs;
      ASSERT_EQ(a.size(), b.size());
      ASSERT_FALSE(a.empty());
      for (size_t k = 0; k < a.size(); ++k) {
        ASSERT_FALSE(a[k].top.empty() || b[k].top.empty());
        agree += a[k].top[0].token == b[k].top[0].token ? 1 : 0;
        const double d = std::fabs(a[k].logprob - b[k].logprob);
        err += d;
        worst = std::max(worst, d);
        ++positions;
      }
    }
    std::printf(
        "%-12s fp8 KV against f32: top token the same at %lld of %lld prompt positions "
        "(%.1f%%); logprob error mean %.4f, max %.4f\n",
        name, static_cast<long long>(agree), static_cast<long long>(positions),
        100.0 * agree / positions, err / positions, worst);
    // Bounds against gross errors only (a scale or a layout wrong by orders of magnitude): these
    // random models' near-uniform logits move by tenths of a nat under 3-bit mantissas, so the op
    // tests (tests/unit/backend: the FP8 path equals the f32 one on the dequantized cache, bit
    // for bit) are what pins the arithmetic down.
    EXPECT_GE(agree * 10, positions * 6);
    EXPECT_LT(err / positions, 0.4);
    EXPECT_LT(worst, 3.0);
    // Greedy, with room for one sequence at a time (preemptions: recomputed rows) and with prefix
    // hits: the same tokens as with room for everything.
    for (EngineRequest& r : reqs) r.params.prompt_logprobs.reset();
    const RunResult roomy = run(**model, *backend, reqs, true, 2 << 20);
    const RunResult tight = run(**model, *backend, reqs, true, fp8.stats.kv_block_bytes * 6);
    EXPECT_GT(tight.stats.scheduler.n_preemptions, 0);
    EXPECT_GT(roomy.stats.scheduler.prefix.hits, 0);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(tight.out[i].tokens, roomy.out[i].tokens) << i;
  }
}

TEST(EngineFp8Kv, NotOnABackendWithoutIt) {
  // The CPU backend has it; a backend that says it has not is refused at start-up with the reason.
  struct NoFp8 : ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    bool supports_fp8_kv_cache() const override { return false; }
  };
  auto cpu = make_cpu_backend(false);
  NoFp8 backend(*cpu);
  auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
  ASSERT_TRUE(ckpt.ok());
  auto model = load_model(*ckpt, backend);
  ASSERT_TRUE(model.ok());
  EngineConfig cfg;
  cfg.kv_cache_memory = 4 << 20;
  cfg.fp8_kv_cache = true;
  auto e = Engine::create(**model, backend, nullptr, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("does not read an FP8 KV cache"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace pagellm
