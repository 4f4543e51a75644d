// Sampler: picks the next token of every sequence in a step from its row of logits, the CPU
// reference of the sampling semantics (the CUDA sampler implements the same contract).
//
// Input: logits [n_rows, vocab] f32 (one row per sequence that needs a token this step; read
// only), and per row its SamplingParams, its prompt and output token history and its seed.
// Output per row: the token, and when params.logprobs is set its logprob, rank and top-N list.
//
// Order of operations on a row (the same as vLLM's and HF's):
//   0. The row must have no NaN or +inf and at least one finite logit (else a row error).
//   1. logit_bias:        x[t] += bias[t].
//   2. min_tokens:        while n_generated < min_tokens, x[t] = -inf for every stop_token_id
//                         and, unless ignore_eos, every EOS id of the model.
//   3. penalties:         repetition (prompt ∪ output), then frequency and presence (output
//                         only); formulas in logits_processors.h.
//   3b. grammar:          x[t] = -inf for every token SampleRow::allowed leaves out.
//   4. greedy if temperature < kGreedyTemperature: the argmax of x, lowest id on ties; top-k,
//      top-p and min-p do not change it. Otherwise:
//   5. temperature:       p ∝ exp((x - max x) / T) in fp32 (no clamping of small T is needed).
//   6. top-k, 7. top-p (on the top-k-renormalized distribution), 8. min-p (relative to the most
//      likely token): the kept set is a prefix of the token order (logit desc, id asc).
//   9. draw:              inverse CDF over the kept set in ascending token id order with
//                         u = uniform01(seed, n_generated) (sample_rng.h), masses in double.
// Exact definitions of 5-9 are those of sample_truncated() in logits_processors.h.
//
// Randomness. A row's draw depends only on (its seed, n_generated = output_tokens.size()), never
// on other rows or their order. The engine gives each sequence its seed at admission:
// params.seed, or draw_random_seed() when unset, then derive_sequence_seed(seed, i) for the i-th
// of n completions.
//
// Logprobs report the model's own distribution: log_softmax of the RAW row, before bias,
// penalties, temperature and truncation (vLLM's default "raw_logprobs"), so they are what an
// OpenAI client expects and do not change with the sampling settings. Ranks and the top-N list use
// the same token order (ties: lower id first). Without params.logprobs, logprob is NaN, rank 0.
//
// Errors. Batch-level problems (shape, dtype, sizes) return an error Status and write nothing.
// A problem confined to one row (non-finite logits, a history or bias token outside the
// vocabulary, nothing left to sample) sets that row's status and token = -1; the other rows are
// sampled normally.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "sample/logits_processors.h"
#include "sample/logprobs.h"
#include "sample/sample_rng.h"
#include "sample/sampling_params.h"

namespace pagellm {

class ThreadPool;

struct SamplerConfig {
  int32_t vocab_size = 0;              // the logits' width
  std::vector<int32_t> eos_token_ids;  // the model's EOS ids (generation_config may list several)
  ThreadPool* pool = nullptr;          // null: ThreadPool::global()
  // Rows are spread over the pool from this many rows up; below it the caller's thread does all.
  int32_t min_rows_for_parallel = 2;
};

struct SampleRow {
  const SamplingParams* params = nullptr;  // validated (SamplingParams::validate) by the caller
  std::span<const int32_t> prompt_tokens;  // for the repetition penalty
  std::span<const int32_t> output_tokens;  // generated so far; its size is the RNG step
  uint64_t seed = 0;                       // this sequence's effective seed
  // The tokens a grammar allows next (bit t % 32 of word t / 32, token_mask_words(vocab) words);
  // empty: no constraint.
  std::span<const uint32_t> allowed = {};
};

struct SampleOutput {
  Status status;  // this row's error, if any
  int32_t token = -1;
  float logprob = std::numeric_limits<float>::quiet_NaN();
  int32_t rank = 0;                        // 1-based rank of `token` in the raw distribution
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, best first
};

// Sets out's token, and with params.logprobs its logprob, rank and top-N list from the raw row:
// for a token chosen outside sample() (speculative decoding's verification).
void set_sampled_token(std::span<const float> raw, const SamplingParams& params, int32_t token,
                       SampleOutput& out);

class Sampler {
 public:
  explicit Sampler(SamplerConfig config);

  const SamplerConfig& config() const { return config_; }

  // Samples rows.size() tokens from logits [rows.size(), vocab_size] (f32, CPU, read only) into
  // out[0 .. rows.size()). Thread-safe: concurrent calls share nothing but the pool.
  Status sample(const Tensor& logits, std::span<const SampleRow> rows,
                std::span<SampleOutput> out) const;
  // The distribution sample() draws a row's token from (steps 1-8): the kept tokens in ascending
  // id order, masses summing to 1; a greedy row's argmax alone. `raw` is one row of vocab_size
  // logits. The row's errors are sample()'s, with out empty.
  Status distribution(std::span<const float> raw, const SampleRow& row,
                      std::vector<TokenProb>& out) const;

 private:
  SamplerConfig config_;
};

}  // namespace pagellm
