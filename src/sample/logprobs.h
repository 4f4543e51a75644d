// Log-probabilities of one row of logits, for the OpenAI `logprobs` / `top_logprobs` fields and
// for prompt_logprobs.
//
//   logprob[t] = logit[t] - (m + log(sum_t' exp(logit[t'] - m))),   m = max finite logit,
// each exp in fp32 (exp_nonpositive, sample_math.h), the sum accumulated in double, the result
// rounded to fp32. -inf logits give -inf. The top-N list and the rank use the token order of logits_processors.h (higher logit
// first, lower id first on ties): top[0] is rank 1, and a token's rank is 1 + the number of
// tokens ranked before it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "sample/logits_processors.h"

namespace pagellm {

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct LogprobsResult {
  float logprob = 0.0f;  // of the requested token
  int32_t rank = 0;      // 1-based
  std::vector<TokenLogprob> top;  // the top_n best, best first
};

// Logprob and rank of `token` (in [0, logits.size()) ) and the top_n best tokens. The row must
// have at least one finite logit and no NaN or +inf.
void compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n,
                      LogprobsResult& out, std::vector<TokenLogit>* scratch = nullptr);

// prompt_logprobs for a prefill chunk: row i of logits [n_rows, vocab] (f32, CPU) predicts
// next_tokens[i]. Rows run in parallel on the global thread pool. Errors name the row: a shape
// mismatch, a token outside the vocabulary, or a row with NaN / +inf / no finite logit.
Status compute_prompt_logprobs(const Tensor& logits, std::span<const int32_t> next_tokens,
                               int32_t top_n, std::span<LogprobsResult> out);

}  // namespace pagellm
