// The plain-data description of one sampling step on a device backend (Backend::sample): what the
// host packs per row (sample/sample_batch.h builds it from SamplingParams and token histories) and
// what comes back per row. The semantics are those of the CPU Sampler (sample/sampler.h); these
// structs only carry them. Every field is plain old data so a batch travels to the device in one
// copy and its results come back in another.
#pragma once

#include <cstdint>
#include <type_traits>

// Marks the backend headers' inline functions that host code and CUDA kernels share.
#ifdef __CUDACC__
#define PAGELLM_BACKEND_HD __host__ __device__
#else
#define PAGELLM_BACKEND_HD
#endif

namespace pagellm {

// OpenAI's top_logprobs limit (the same value as kMaxLogprobs in sample/sampling_params.h, which
// this layer cannot include).
inline constexpr int32_t kDeviceSampleMaxTop = 20;

// DeviceSampleRow::flags
inline constexpr uint32_t kSampleGreedy = 1u << 0;  // argmax (temperature < kGreedyTemperature)
// The host already found a problem with this row (a token outside the vocabulary): the device
// only checks the logits' finiteness (whose error takes precedence, as in the CPU Sampler) and
// samples nothing.
inline constexpr uint32_t kSampleSkip = 1u << 1;

// One row to sample.
struct DeviceSampleRow {
  int32_t logits_row = 0;  // row of the logits tensor to read; n > 1 samples share one
  uint32_t flags = 0;
  float temperature = 1.0f;  // > 0 unless greedy
  int32_t top_k = -1;        // <= 0 or >= vocab: off
  float top_p = 1.0f;        // 1: off
  // The min-p cut on s = (logit - max) / T, exactly as the CPU computes it:
  // max(kExpMinArg, logf(min_p)) when min_p > 0, else kExpMinArg (sample/logits_processors.cpp).
  float s_min = 0.0f;
  float repetition = 1.0f;  // the penalties' parameters; which tokens they touch is in the edits
  float presence = 0.0f;
  float frequency = 0.0f;
  int32_t n_logprobs = -1;  // -1: no logprobs; else the top-N count, [0, kDeviceSampleMaxTop]
  int32_t edit_begin = 0;   // this row's edits: [edit_begin, edit_end) of the edit list,
  int32_t edit_end = 0;     // sorted by token, one entry per distinct token
  uint64_t seed = 0;        // u = uniform01(seed, step) (sample/sample_rng.h)
  uint64_t step = 0;        // tokens generated so far
  // A grammar's allowed-token mask: words [mask_word, mask_word + ceil(vocab / 32)) of the call's
  // mask list, bit t % 32 of word t / 32 set for each allowed token t; every other token's
  // processed logit becomes -inf after the edits (the CPU Sampler's step 3b). -1: no mask.
  int64_t mask_word = -1;
};

// DeviceSampleEdit::flags
inline constexpr uint32_t kEditBias = 1u << 0;        // logit += bias
inline constexpr uint32_t kEditSuppress = 1u << 1;    // logit = -inf (min_tokens)
inline constexpr uint32_t kEditRepetition = 1u << 2;  // in prompt or output: repetition penalty
// Everything the CPU's logit_bias, suppress_tokens and apply_penalties do to one token of one row,
// applied in that order: bias, suppression, repetition, then (when output_count > 0)
// logit -= output_count * frequency + presence.
struct DeviceSampleEdit {
  int32_t token = 0;
  uint32_t flags = 0;
  float bias = 0.0f;
  int32_t output_count =
      0;  // occurrences in the output; nonzero only when presence/frequency apply
};

// One sampling call's inputs, all in host memory: the rows, the edits they index
// (rows[i].edit_begin .. edit_end) and the grammar masks they index (rows[i].mask_word).
struct DeviceSampleInputs {
  const DeviceSampleRow* rows = nullptr;
  int32_t n_rows = 0;
  const DeviceSampleEdit* edits = nullptr;
  int32_t n_edits = 0;
  const uint32_t* masks = nullptr;
  int64_t n_mask_words = 0;
};

// DeviceSampleResult::status
enum class DeviceSampleStatus : int32_t {
  kOk = 0,
  kNan = 1,              // the raw row has a NaN; detail = the lowest such token
  kPosInf = 2,           // the raw row has a +inf (and no NaN before it); detail = that token
  kAllNegInf = 3,        // every raw logit is -inf
  kNothingToSample = 4,  // every logit is -inf after logit_bias, min_tokens and penalties
  kSkipped = 5,          // kSampleSkip: the host reports the row's error
};

struct DeviceSampleResult {
  int32_t token = -1;
  DeviceSampleStatus status = DeviceSampleStatus::kOk;
  int32_t detail = -1;
  int32_t rank = 0;      // 1-based rank of `token` in the raw row (with logprobs)
  float logprob = 0.0f;  // of `token` in the raw row (with logprobs)
  int32_t n_top = 0;     // entries of the top-N list
  int32_t top_token[kDeviceSampleMaxTop] = {};
  float top_logprob[kDeviceSampleMaxTop] = {};
};

// The token id a step reads for its input id t (Backend::take_sampled_tokens): t itself when
// t >= 0, else the token of row -(t + 1) of a sampling call's n_rows results, or 0 where that row
// failed or does not exist (any valid id: such a step is discarded). The host default and the
// CUDA kernel both use it.
PAGELLM_BACKEND_HD inline int32_t sampled_token_for(int32_t t, const DeviceSampleResult* results,
                                                    int64_t n_rows) {
  if (t >= 0) return t;
  const int64_t row = -(int64_t{t} + 1);
  return row < n_rows && results[row].status == DeviceSampleStatus::kOk && results[row].token >= 0
             ? results[row].token
             : 0;
}

static_assert(std::is_trivially_copyable_v<DeviceSampleRow>);
static_assert(std::is_trivially_copyable_v<DeviceSampleEdit>);
static_assert(std::is_trivially_copyable_v<DeviceSampleResult>);

}  // namespace pagellm
