#include "sample/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"
#include "core/thread_pool.h"
#include "sample/sample_math.h"

namespace pagellm {
namespace {

// log(sum_t exp(x[t] - m)) + m, exps in fp32 (exp_nonpositive: x - m <= 0), eight double partial sums (fixed order, so the
// result depends only on the row) that the compiler can keep in vector registers.
double log_sum_exp(std::span<const float> x, float m) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  const size_t n = x.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(exp_nonpositive(x[i + j] - m));
  for (; i < n; ++i) acc[0] += static_cast<double>(exp_nonpositive(x[i] - m));
  double sum = 0.0;
  for (double a : acc) sum += a;
  return static_cast<double>(m) + std::log(sum);
}

}  // namespace

void compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n,
                      LogprobsResult& out, std::vector<TokenLogit>* scratch) {
  PAGELLM_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size());
  const float m = max_logit(logits);
  PAGELLM_CHECK_MSG(std::isfinite(m), "compute_logprobs needs a finite logit");
  const double lse = log_sum_exp(logits, m);
  const float xt = logits[token];
  out.logprob = static_cast<float>(static_cast<double>(xt) - lse);
  // Rank: 1 + tokens strictly better, plus equal logits at lower ids.
  int64_t better = 0;
  for (size_t i = 0; i < logits.size(); ++i) better += logits[i] > xt;
  for (int32_t i = 0; i < token; ++i) better += logits[i] == xt;
  out.rank = static_cast<int32_t>(better + 1);
  out.top.clear();
  if (top_n > 0) {
    std::vector<TokenLogit> local;
    std::vector<TokenLogit>& best = scratch ? *scratch : local;
    select_top_k(logits, top_n, best);
    out.top.reserve(best.size());
    for (const TokenLogit& b : best)
      out.top.push_back({b.token, static_cast<float>(static_cast<double>(b.logit) - lse)});
  }
}

Status compute_prompt_logprobs(const Tensor& logits, std::span<const int32_t> next_tokens,
                               int32_t top_n, std::span<LogprobsResult> out) {
  if (logits.dtype != DType::kF32 || logits.device != Device::kCpu || logits.ndim != 2)
    return invalid_argument("prompt_logprobs: logits must be a 2-D f32 CPU tensor, got " +
                            logits.shape_string());
  const int64_t n_rows = logits.size(0), vocab = logits.size(1);
  if (static_cast<int64_t>(next_tokens.size()) != n_rows ||
      static_cast<int64_t>(out.size()) != n_rows)
    return invalid_argument("prompt_logprobs: " + std::to_string(n_rows) + " logits rows but " +
                            std::to_string(next_tokens.size()) + " tokens and " +
                            std::to_string(out.size()) + " outputs");
  if (top_n < 0 || top_n > kMaxLogprobs)
    return invalid_argument("prompt_logprobs: top_n must be in [0, 20], got " +
                            std::to_string(top_n));
  for (int64_t r = 0; r < n_rows; ++r) {
    if (next_tokens[r] < 0 || next_tokens[r] >= vocab)
      return out_of_range("prompt_logprobs: row " + std::to_string(r) + " token " +
                          std::to_string(next_tokens[r]) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")");
  }
  std::vector<Status> row_status(n_rows);
  ThreadPool::global().parallel_for(n_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<TokenLogit> scratch;
    for (int64_t r = begin; r < end; ++r) {
      std::span<const float> row(static_cast<const float*>(logits.row_ptr(r)), vocab);
      row_status[r] = check_logits_row(row, r);
      if (row_status[r].ok()) compute_logprobs(row, next_tokens[r], top_n, out[r], &scratch);
    }
  });
  for (Status& st : row_status)
    if (!st.ok()) return invalid_argument("prompt_logprobs: " + st.message());
  return Status::ok_status();
}

}  // namespace pagellm
