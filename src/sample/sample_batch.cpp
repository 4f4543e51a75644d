#include "sample/sample_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"
#include "core/thread_pool.h"
#include "sample/logits_processors.h"
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

// Per-thread buffers for packing a row, reused across rows and steps.
struct PackScratch {
  // Per token: its edit's index in `edits`, valid where stamp[t] == epoch (no clearing of the
  // vocabulary-sized arrays between rows).
  std::vector<uint32_t> stamp;
  std::vector<int32_t> slot;
  uint32_t epoch = 0;
  std::vector<DeviceSampleEdit> edits;  // this row's, in first-touch order
  std::vector<uint32_t> tokens, tmp;    // their tokens, then sorted
  std::vector<int32_t> suppress;
};

PackScratch& pack_scratch(int32_t vocab) {
  thread_local PackScratch s;
  if (s.stamp.size() != static_cast<size_t>(vocab)) {
    s.stamp.assign(static_cast<size_t>(vocab), 0);
    s.slot.assign(static_cast<size_t>(vocab), 0);
    s.epoch = 0;
  }
  return s;
}

// Sorts distinct token ids below `vocab` ascending: LSD radix sort with 11-bit digits (a row's
// history touches a few thousand tokens; a comparison sort of them cost most of the packing).
void sort_tokens(std::vector<uint32_t>& v, std::vector<uint32_t>& tmp, int32_t vocab) {
  if (v.size() < 256) {
    std::sort(v.begin(), v.end());
    return;
  }
  constexpr int kBits = 11;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  tmp.resize(v.size());
  uint32_t count[1u << kBits];
  for (int shift = 0; (static_cast<uint32_t>(vocab - 1) >> shift) != 0; shift += kBits) {
    std::fill(std::begin(count), std::end(count), 0u);
    for (uint32_t t : v) ++count[(t >> shift) & kMask];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t n = c;
      c = sum;
      sum += n;
    }
    for (uint32_t t : v) tmp[count[(t >> shift) & kMask]++] = t;
    v.swap(tmp);
  }
}

}  // namespace

SampleBatchPacker::SampleBatchPacker(const SamplerConfig& config) : config_(config) {
  PAGELLM_CHECK_MSG(config_.vocab_size > 0, "SampleBatchPacker needs a vocabulary size");
}

Status SampleBatchPacker::pack_row(int64_t r, const SampleRow& row, DeviceSampleRow& d,
                                   std::vector<DeviceSampleEdit>& edits) const {
  PAGELLM_CHECK_MSG(row.params != nullptr, "SampleRow without params");
  const SamplingParams& p = *row.params;
  const int32_t vocab = config_.vocab_size;
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
  edits.clear();

  PackScratch& s = pack_scratch(vocab);
  const int64_t n_generated = static_cast<int64_t>(row.output_tokens.size());
  s.suppress.clear();
  if (n_generated < p.min_tokens) {
    s.suppress.assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
    if (!p.ignore_eos)
      s.suppress.insert(s.suppress.end(), config_.eos_token_ids.begin(),
                        config_.eos_token_ids.end());
  }
  if (p.logit_bias.empty() && s.suppress.empty() && !p.has_penalties()) return Status::ok_status();

  if (++s.epoch == 0) {  // wrapped: stale stamps could alias the new epoch
    std::fill(s.stamp.begin(), s.stamp.end(), 0);
    s.epoch = 1;
  }
  s.edits.clear();
  s.tokens.clear();
  // The edit of token t (created on first touch); an index, as the vector may grow.
  auto touch = [&](int32_t t) -> DeviceSampleEdit& {
    if (s.stamp[t] != s.epoch) {
      s.stamp[t] = s.epoch;
      s.slot[t] = static_cast<int32_t>(s.edits.size());
      DeviceSampleEdit e;
      e.token = t;
      s.edits.push_back(e);
      s.tokens.push_back(static_cast<uint32_t>(t));
    }
    return s.edits[static_cast<size_t>(s.slot[t])];
  };
  auto in_vocab = [&](int64_t t) { return t >= 0 && t < vocab; };
  // Checks in the CPU's order: logit_bias, suppression, then the histories.
  for (const LogitBias& b : p.logit_bias) {
    if (!in_vocab(b.token)) return token_outside(r, "logit_bias", b.token, vocab);
    DeviceSampleEdit& e = touch(b.token);
    if (e.flags & kEditBias) {
      // The CPU would add both in turn; one float cannot carry two rounded additions.
      return invalid_argument("sample: row " + std::to_string(r) + ": 'logit_bias' lists token " +
                              std::to_string(b.token) + " twice (validate() rejects this)");
    }
    e.flags |= kEditBias;
    e.bias = b.bias;
  }
  for (int32_t t : s.suppress) {
    if (!in_vocab(t)) return token_outside(r, "suppressed", t, vocab);
    touch(t).flags |= kEditSuppress;
  }
  const bool use_rep = p.repetition_penalty != 1.0f;
  const bool use_pf = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (use_rep || use_pf) {
    for (int32_t t : row.output_tokens) {
      if (!in_vocab(t)) return token_outside(r, "output", t, vocab);
      DeviceSampleEdit& e = touch(t);
      if (use_rep) e.flags |= kEditRepetition;
      if (use_pf) ++e.output_count;
    }
    if (use_rep) {
      for (int32_t t : row.prompt_tokens) {
        if (!in_vocab(t)) return token_outside(r, "prompt", t, vocab);
        touch(t).flags |= kEditRepetition;
      }
    }
  }
  sort_tokens(s.tokens, s.tmp, vocab);
  edits.resize(s.tokens.size());
  for (size_t i = 0; i < s.tokens.size(); ++i)
    edits[i] = s.edits[static_cast<size_t>(s.slot[s.tokens[i]])];
  return Status::ok_status();
}

void SampleBatchPacker::pack(std::span<const SampleRow> rows, std::span<const int64_t> logits_rows,
                             PackedSampleBatch& out) {
  PAGELLM_CHECK_MSG(rows.size() == logits_rows.size(), "one logits row per sampled row");
  const int64_t n = static_cast<int64_t>(rows.size());
  out.rows.assign(rows.size(), DeviceSampleRow{});
  out.host_status.assign(rows.size(), Status::ok_status());
  if (row_edits_.size() < rows.size()) row_edits_.resize(rows.size());
  auto pack_rows = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      DeviceSampleRow& d = out.rows[k];
      d.logits_row = static_cast<int32_t>(logits_rows[k]);
      Status st = pack_row(k, rows[k], d, row_edits_[k]);
      if (!st.ok()) {
        row_edits_[k].clear();
        d.flags |= kSampleSkip;
        out.host_status[k] = std::move(st);
      }
    }
  };
  // Rows without edits are a few stores each: only histories and biases are worth the pool.
  bool heavy = false;
  for (const SampleRow& row : rows) {
    PAGELLM_CHECK_MSG(row.params != nullptr, "SampleRow without params");
    const SamplingParams& p = *row.params;
    heavy = heavy || p.has_penalties() || !p.logit_bias.empty() ||
            static_cast<int64_t>(row.output_tokens.size()) < p.min_tokens;
  }
  ThreadPool* pool = config_.pool ? config_.pool : &ThreadPool::global();
  if (heavy && n >= config_.min_rows_for_parallel && pool->n_threads() > 1) {
    pool->parallel_for(n, 1, pack_rows);
  } else {
    pack_rows(0, n);
  }
  size_t total = 0;
  for (int64_t k = 0; k < n; ++k) {
    out.rows[k].edit_begin = static_cast<int32_t>(total);
    total += row_edits_[k].size();
    PAGELLM_CHECK_MSG(total <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                      "sample: too many edits in one step");
    out.rows[k].edit_end = static_cast<int32_t>(total);
  }
  out.edits.resize(total);
  for (int64_t k = 0; k < n; ++k)
    std::copy(row_edits_[k].begin(), row_edits_[k].end(),
              out.edits.begin() + out.rows[k].edit_begin);
  // The grammar masks, one after another, each row pointing at its own: where they lie so
  // already (4 MB a step for 256 rows of a 128k vocabulary), in place.
  const int64_t words = token_mask_words(config_.vocab_size);
  const uint32_t* first = nullptr;
  int64_t n_words = 0;
  bool in_place = true;
  for (int64_t k = 0; k < n; ++k) {
    const std::span<const uint32_t> allowed = rows[k].allowed;
    if (allowed.empty()) continue;
    PAGELLM_CHECK_MSG(static_cast<int64_t>(allowed.size()) == words,
                      "sample: a grammar mask must have one bit per token of the vocabulary");
    if (!first) first = allowed.data();
    in_place = in_place && allowed.data() == first + n_words;
    out.rows[k].mask_word = n_words;
    n_words += words;
  }
  out.mask_store.clear();
  if (in_place) {
    out.masks = {first, static_cast<size_t>(n_words)};
    return;
  }
  for (int64_t k = 0; k < n; ++k)
    out.mask_store.insert(out.mask_store.end(), rows[k].allowed.begin(), rows[k].allowed.end());
  out.masks = out.mask_store;
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
          for (int32_t j = 0; j < n; ++j)
            o.top_logprobs.push_back({r.top_token[j], r.top_logprob[j]});
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
