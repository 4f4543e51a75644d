// Benchmark workloads: what each request asks for. Synthetic prompts are token ids (sent as
// `"prompt": [ids]`, so the input length is exact whatever the server's tokenizer); dataset
// prompts are text.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace pagellm::bench {

struct BenchRequest {
  std::string prompt_text;           // used when prompt_ids is empty
  std::vector<int32_t> prompt_ids;   // token-id prompt
  int64_t prompt_len = 0;            // expected prompt tokens (exact for ids, estimated for text)
  int64_t max_tokens = 1;
};

// A distribution of token lengths around a nominal length L.
//   fixed             always L
//   uniform:LO,HI     uniform integers in [LO, HI]
//   lognormal:SIGMA   log-normal with mean L and log-space std SIGMA
//   pareto:ALPHA      Pareto with mean L and tail index ALPHA (> 1)
// Samples are clamped to [1, 16 L] (heavy tails otherwise produce lengths no model accepts).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kLogNormal, kPareto } kind = Kind::kFixed;
  int64_t length = 128;
  int64_t lo = 0, hi = 0;
  double param = 0;  // sigma or alpha
  int64_t sample(std::mt19937_64& rng) const;
};
Result<LengthDist> parse_length_dist(std::string_view spec, int64_t length, const std::string& option);

struct RandomWorkloadOptions {
  int64_t n = 100;
  LengthDist input, output;
  // Token ids are drawn uniformly from [kFirstId, vocab_size): the low ids hold the special tokens
  // of most vocabularies, and every served vocabulary is larger than the default.
  int64_t vocab_size = 1000;
  uint64_t seed = 0;
};
inline constexpr int32_t kFirstRandomId = 100;
Result<std::vector<BenchRequest>> random_workload(const RandomWorkloadOptions& o);

// Many requests over a few long shared system prompts (prefix caching's best case): request i
// uses prefix i % n_prefixes of prefix_len tokens followed by its own random suffix.
struct SharedPrefixOptions {
  RandomWorkloadOptions base;  // n, suffix lengths (input), output lengths, vocab, seed
  int64_t n_prefixes = 4;
  int64_t prefix_len = 1024;
};
Result<std::vector<BenchRequest>> shared_prefix_workload(const SharedPrefixOptions& o);

// Counts tokens of a text (a real tokenizer, or the estimate below).
using TokenCounter = std::function<int64_t(std::string_view)>;
// About 4 bytes per token, the usual figure for English BPE vocabularies; only used when no
// tokenizer is given, and only for expected lengths (measured lengths come from the server).
int64_t estimate_tokens(std::string_view text);

// ShareGPT JSON: an array of {"conversations": [{"from": "human", "value": P}, {"from": "gpt",
// "value": R}, ...]}; the prompt is P and max_tokens is the token count of R (or
// `fixed_output_len` when > 0). Conversations with fewer than two turns are skipped. The pool is
// shuffled with `seed` and `n` requests are taken from entry `first` on, cycling if the file is
// short; `pool_size`, when given, receives the number of usable conversations.
Result<std::vector<BenchRequest>> sharegpt_workload(const std::string& path, int64_t n,
                                                    int64_t fixed_output_len, uint64_t seed,
                                                    const TokenCounter& count_tokens, int64_t first = 0,
                                                    int64_t* pool_size = nullptr);

// JSON lines of {"prompt": text or [ids], "max_tokens": N}; max_tokens falls back to
// `default_max_tokens`. `n` lines are used from request `first` on (0: the first line), cycling
// when the file is short; `pool_size`, when given, receives the number of requests in the file.
Result<std::vector<BenchRequest>> jsonl_workload(const std::string& path, int64_t n,
                                                 int64_t default_max_tokens,
                                                 const TokenCounter& count_tokens, int64_t first = 0,
                                                 int64_t* pool_size = nullptr);

// --- one workload per run ---
// A rate sweep sends one workload per rate. Were it the same one, every rate after the first
// would find its prompts in the server's prefix cache and look faster than it is; so run i of a
// benchmark draws its own prompts: synthetic workloads from run_workload_seed(seed, i), datasets
// from entry i * n on (distinct entries while the file has enough). Run 0 is what a single run
// sends, so a single-rate benchmark is unchanged and a sweep's first rate matches it.

// The seed of run `run_index`: `base_seed` for run 0, else a splitmix64 hash of both.
uint64_t run_workload_seed(uint64_t base_seed, int64_t run_index);

struct WorkloadSpec {
  std::string dataset = "random";  // random | shared-prefix | sharegpt | jsonl
  std::string path;                // sharegpt, jsonl
  RandomWorkloadOptions random;    // n, lengths, vocab size and the base seed (every dataset's n and seed)
  int64_t n_prefixes = 4;          // shared-prefix
  int64_t prefix_len = 1024;       // shared-prefix
  int64_t fixed_output_len = 0;    // sharegpt: > 0 replaces the answer's length
  int64_t default_max_tokens = 128;  // jsonl: for lines without max_tokens
  TokenCounter count_tokens = estimate_tokens;
};

struct Workload {
  std::vector<BenchRequest> requests;
  uint64_t seed = 0;        // the seed its prompts (or, for ShareGPT, its shuffle) came from
  int64_t first = -1;       // datasets: the first pool entry used; -1 for synthetic workloads
  int64_t pool_size = 0;    // datasets: entries in the file; 0 for synthetic workloads
  // Whether a dataset run had to reuse entries that runs 0 .. run_index - 1 used (or its own).
  bool reuses_entries = false;
};

Result<Workload> make_workload(const WorkloadSpec& spec, int64_t run_index);

}  // namespace pagellm::bench
