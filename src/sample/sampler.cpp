#include "sample/sampler.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/thread_pool.h"
#include "sample/logits_processors.h"

namespace pagellm {
namespace {

// Per-thread buffers, reused across rows and steps.
struct RowScratch {
  std::vector<float> processed;   // [vocab] the row after bias / suppression / penalties
  std::vector<int32_t> suppress;  // min_tokens: the ids to mask
  SampleScratch sample;
};

RowScratch& thread_scratch() {
  thread_local RowScratch scratch;
  return scratch;
}

Status row_error(int64_t row, const Status& st) {
  return {st.code(), "sample: row " + std::to_string(row) + ": " + st.message()};
}

// Steps 0-3b on a row: x becomes the processed row (raw itself when no processor changes it, else
// the thread's copy). A row error is returned with the row's index in its message.
Status process_row(const SamplerConfig& config, std::span<const float> raw, const SampleRow& row,
                   int64_t r, RowScratch& s, std::span<const float>& x) {
  PAGELLM_CHECK_MSG(row.params != nullptr, "SampleRow without params");
  const SamplingParams& p = *row.params;
  Status st = check_logits_row(raw, r);
  if (!st.ok()) return {st.code(), "sample: " + st.message()};
  const int64_t n_generated = static_cast<int64_t>(row.output_tokens.size());
  s.suppress.clear();
  if (n_generated < p.min_tokens) {
    s.suppress.assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
    if (!p.ignore_eos)
      s.suppress.insert(s.suppress.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());
  }
  // The raw row stays untouched (logprobs need it); edits go to a per-thread copy, made only
  // when some processor changes a logit.
  x = raw;
  if (!p.logit_bias.empty() || !s.suppress.empty() || p.has_penalties() || !row.allowed.empty()) {
    s.processed.resize(raw.size());
    std::memcpy(s.processed.data(), raw.data(), raw.size_bytes());
    std::span<float> xp(s.processed);
    st = apply_logit_bias(xp, p.logit_bias);
    if (st.ok()) st = suppress_tokens(xp, s.suppress);
    if (st.ok())
      st = apply_penalties(xp, row.prompt_tokens, row.output_tokens, p.repetition_penalty,
                           p.presence_penalty, p.frequency_penalty, &s.sample);
    if (st.ok() && !row.allowed.empty()) st = apply_token_mask(xp, row.allowed);
    if (!st.ok()) return row_error(r, st);
    x = xp;
  }
  return Status::ok_status();
}

Status nothing_to_sample(int64_t r) {
  return invalid_argument("sample: row " + std::to_string(r) +
                          ": no token can be sampled (every logit is -inf after "
                          "logit_bias, min_tokens and penalties)");
}

void sample_row(const SamplerConfig& config, std::span<const float> raw, const SampleRow& row,
                int64_t r, SampleOutput& out) {
  const SamplingParams& p = *row.params;
  out.status = Status::ok_status();
  out.token = -1;
  out.logprob = std::numeric_limits<float>::quiet_NaN();
  out.rank = 0;
  out.top_logprobs.clear();
  RowScratch& s = thread_scratch();
  std::span<const float> x;
  out.status = process_row(config, raw, row, r, s, x);
  if (!out.status.ok()) return;
  const int64_t n_generated = static_cast<int64_t>(row.output_tokens.size());

  int32_t token;
  if (p.is_greedy()) {
    token = argmax_token(x);
  } else {
    const TruncationParams tp{p.temperature, p.top_k, p.top_p, p.min_p};
    token =
        sample_truncated(x, tp, uniform01(row.seed, static_cast<uint64_t>(n_generated)), &s.sample);
  }
  if (token < 0) {
    out.status = nothing_to_sample(r);
    return;
  }
  set_sampled_token(raw, p, token, out);
}

}  // namespace

void set_sampled_token(std::span<const float> raw, const SamplingParams& p, int32_t token,
                       SampleOutput& out) {
  out.token = token;
  if (p.logprobs) {
    LogprobsResult lp;
    compute_logprobs(raw, token, *p.logprobs, lp, &thread_scratch().sample.candidates);
    out.logprob = lp.logprob;
    out.rank = lp.rank;
    out.top_logprobs = std::move(lp.top);
  }
}

Sampler::Sampler(SamplerConfig config) : config_(std::move(config)) {
  PAGELLM_CHECK_MSG(config_.vocab_size > 0, "Sampler needs a vocabulary size");
}

Status Sampler::sample(const Tensor& logits, std::span<const SampleRow> rows,
                       std::span<SampleOutput> out) const {
  if (logits.dtype != DType::kF32 || logits.device != Device::kCpu || logits.ndim != 2)
    return invalid_argument("sample: logits must be a 2-D f32 CPU tensor, got " +
                            logits.shape_string());
  const int64_t n_rows = logits.size(0), vocab = logits.size(1);
  if (vocab != config_.vocab_size)
    return invalid_argument("sample: logits have " + std::to_string(vocab) +
                            " columns, the vocabulary has " + std::to_string(config_.vocab_size));
  if (static_cast<int64_t>(rows.size()) != n_rows || static_cast<int64_t>(out.size()) != n_rows)
    return invalid_argument("sample: " + std::to_string(n_rows) + " logits rows but " +
                            std::to_string(rows.size()) + " rows and " +
                            std::to_string(out.size()) + " outputs");
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::span<const float> raw(static_cast<const float*>(logits.row_ptr(r)), vocab);
      sample_row(config_, raw, rows[r], r, out[r]);
    }
  };
  if (n_rows >= config_.min_rows_for_parallel) {
    ThreadPool& pool = config_.pool ? *config_.pool : ThreadPool::global();
    pool.parallel_for(n_rows, 1, run);
  } else {
    run(0, n_rows);
  }
  return Status::ok_status();
}

Status Sampler::distribution(std::span<const float> raw, const SampleRow& row,
                             std::vector<TokenProb>& out) const {
  out.clear();
  if (static_cast<int64_t>(raw.size()) != config_.vocab_size)
    return invalid_argument("sample: a logits row of " + std::to_string(raw.size()) +
                            " entries, the vocabulary has " + std::to_string(config_.vocab_size));
  RowScratch& s = thread_scratch();
  std::span<const float> x;
  Status st = process_row(config_, raw, row, 0, s, x);
  if (!st.ok()) return st;
  const SamplingParams& p = *row.params;
  if (p.is_greedy()) {
    const int32_t t = argmax_token(x);
    if (t >= 0) out.push_back({t, 1.0});
  } else {
    out = truncated_distribution(x, {p.temperature, p.top_k, p.top_p, p.min_p}, &s.sample);
  }
  return out.empty() ? nothing_to_sample(0) : Status::ok_status();
}

}  // namespace pagellm
