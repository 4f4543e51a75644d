#include "sample/sample_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"
#include "sample/sample_math.h"

namespace pagellm {

static_assert(kDeviceSampleMaxTop == kMaxLogprobs, "the device result holds kMaxLogprobs entries");

namespace {

// The CPU Sampler's messages (sampler.cpp, logits_processors.cpp), so either device reports a bad
// row the same way.
Status token_outside(int64_t row, const char* what, int64_t token, int32_t vocab) {
  return out_of_range("sample: row " + std::to_string(row) + ": " + what + " token " +
                      std::to_string(token) + " is outside the vocabulary [0, " +
                      std::to_string(vocab) + ")");
}

}  // namespace

SampleBatchPacker::SampleBatchPacker(const SamplerConfig& config)
    : vocab_(config.vocab_size), eos_(config.eos_token_ids) {
  PAGELLM_CHECK_MSG(vocab_ > 0, "SampleBatchPacker needs a vocabulary size");
  stamp_.assign(static_cast<size_t>(vocab_), 0);
  slot_.assign(static_cast<size_t>(vocab_), 0);
}

void SampleBatchPacker::pack(std::span<const SampleRow> rows, std::span<const int64_t> logits_rows,
                             PackedSampleBatch& out) {
  PAGELLM_CHECK_MSG(rows.size() == logits_rows.size(), "one logits row per sampled row");
  out.rows.clear();
  out.edits.clear();
  out.host_status.assign(rows.size(), Status::ok_status());
  for (size_t k = 0; k < rows.size(); ++k) {
    const SampleRow& row = rows[k];
    PAGELLM_CHECK_MSG(row.params != nullptr, "SampleRow without params");
    const SamplingParams& p = *row.params;
    const int64_t r = static_cast<int64_t>(k);
    DeviceSampleRow d;
    d.logits_row = static_cast<int32_t>(logits_rows[k]);
    d.flags = p.is_greedy() ? kSampleGreedy : 0u;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    // Exactly build_kept's s_min (logits_processors.cpp), with the host's logf.
    d.s_min = p.min_p > 0.0f ? std::max(kExpMinArg, std::log(p.min_p)) : kExpMinArg;
    d.repetition = p.repetition_penalty;
    d.presence = p.presence_penalty;
    d.frequency = p.frequency_penalty;
    d.n_logprobs = p.logprobs ? *p.logprobs : -1;
    d.seed = row.seed;
    d.step = static_cast<uint64_t>(row.output_tokens.size());

    const int64_t n_generated = static_cast<int64_t>(row.output_tokens.size());
    suppress_.clear();
    if (n_generated < p.min_tokens) {
      suppress_.assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
      if (!p.ignore_eos) suppress_.insert(suppress_.end(), eos_.begin(), eos_.end());
    }
    const size_t begin = out.edits.size();
    Status st = Status::ok_status();
    if (!p.logit_bias.empty() || !suppress_.empty() || p.has_penalties()) {
      if (++epoch_ == 0) {  // wrapped: stale stamps could alias the new epoch
        std::fill(stamp_.begin(), stamp_.end(), 0);
        epoch_ = 1;
      }
      // The edit of token t (created on first touch); an index, as the vector may grow.
      auto touch = [&](int32_t t) -> size_t {
        if (stamp_[t] != epoch_) {
          stamp_[t] = epoch_;
          slot_[t] = static_cast<int32_t>(out.edits.size());
          DeviceSampleEdit e;
          e.token = t;
          out.edits.push_back(e);
        }
        return static_cast<size_t>(slot_[t]);
      };
      auto in_vocab = [&](int64_t t) { return t >= 0 && t < vocab_; };
      // Checks in the CPU's order: logit_bias, suppression, then the histories.
      for (const LogitBias& b : p.logit_bias) {
        if (!in_vocab(b.token)) {
          st = token_outside(r, "logit_bias", b.token, vocab_);
          break;
        }
        DeviceSampleEdit& e = out.edits[touch(b.token)];
        if (e.flags & kEditBias) {
          // The CPU would add both in turn; one float cannot carry two rounded additions.
          st = invalid_argument("sample: row " + std::to_string(r) + ": 'logit_bias' lists token " +
                                std::to_string(b.token) + " twice (validate() rejects this)");
          break;
        }
        e.flags |= kEditBias;
        e.bias = b.bias;
      }
      if (st.ok()) {
        for (int32_t t : suppress_) {
          if (!in_vocab(t)) {
            st = token_outside(r, "suppressed", t, vocab_);
            break;
          }
          out.edits[touch(t)].flags |= kEditSuppress;
        }
      }
      const bool use_rep = p.repetition_penalty != 1.0f;
      const bool use_pf = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
      if (st.ok() && (use_rep || use_pf)) {
        for (int32_t t : row.output_tokens) {
          if (!in_vocab(t)) {
            st = token_outside(r, "output", t, vocab_);
            break;
          }
          DeviceSampleEdit& e = out.edits[touch(t)];
          if (use_rep) e.flags |= kEditRepetition;
          if (use_pf) ++e.output_count;
        }
        if (st.ok() && use_rep) {
          for (int32_t t : row.prompt_tokens) {
            if (!in_vocab(t)) {
              st = token_outside(r, "prompt", t, vocab_);
              break;
            }
            out.edits[touch(t)].flags |= kEditRepetition;
          }
        }
      }
    }
    if (!st.ok()) {
      out.edits.resize(begin);
      d.flags |= kSampleSkip;
      out.host_status[k] = st;
    }
    std::sort(out.edits.begin() + static_cast<std::ptrdiff_t>(begin), out.edits.end(),
              [](const DeviceSampleEdit& a, const DeviceSampleEdit& b) { return a.token < b.token; });
    PAGELLM_CHECK_MSG(out.edits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                      "sample: too many edits in one step");
    d.edit_begin = static_cast<int32_t>(begin);
    d.edit_end = static_cast<int32_t>(out.edits.size());
    out.rows.push_back(d);
  }
}

void SampleBatchPacker::unpack(const PackedSampleBatch& batch,
                               std::span<const DeviceSampleResult> results,
                               std::span<SampleOutput> out) {
  PAGELLM_CHECK(results.size() == batch.rows.size() && out.size() == batch.rows.size());
  for (size_t k = 0; k < results.size(); ++k) {
    const DeviceSampleResult& r = results[k];
    SampleOutput& o = out[k];
    const std::string row = std::to_string(k);
    o.status = Status::ok_status();
    o.token = -1;
    o.logprob = std::numeric_limits<float>::quiet_NaN();
    o.rank = 0;
    o.top_logprobs.clear();
    switch (r.status) {
      case DeviceSampleStatus::kOk:
        o.token = r.token;
        if (batch.rows[k].n_logprobs >= 0) {
          o.logprob = r.logprob;
          o.rank = r.rank;
          const int32_t n = std::clamp(r.n_top, 0, kDeviceSampleMaxTop);
          o.top_logprobs.reserve(n);
          for (int32_t j = 0; j < n; ++j) o.top_logprobs.push_back({r.top_token[j], r.top_logprob[j]});
        }
        break;
      case DeviceSampleStatus::kNan:
      case DeviceSampleStatus::kPosInf:
        o.status = invalid_argument("sample: logits row " + row + ": token " +
                                    std::to_string(r.detail) + " has a non-finite logit (" +
                                    (r.status == DeviceSampleStatus::kNan ? "nan" : "+inf") + ")");
        break;
      case DeviceSampleStatus::kAllNegInf:
        o.status = invalid_argument("sample: logits row " + row + ": every logit is -inf");
        break;
      case DeviceSampleStatus::kSkipped:
        o.status = batch.host_status[k];
        break;
      case DeviceSampleStatus::kNothingToSample:
        o.status = invalid_argument("sample: row " + row +
                                    ": no token can be sampled (every logit is -inf after "
                                    "logit_bias, min_tokens and penalties)");
        break;
      default:
        o.status = internal_error("sample: row " + row + ": unknown device status " +
                                  std::to_string(static_cast<int32_t>(r.status)));
    }
  }
}

}  // namespace pagellm
