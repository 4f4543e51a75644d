// The device sampler's host side: packing SampleRows into rows + sparse edits, and reading results
// back. The edits are checked against the CPU processors themselves: applying a row's edits to its
// raw logits (by the rule device_sample.h documents) must give bit for bit the row that
// apply_logit_bias, suppress_tokens and apply_penalties give.
#include "sample/sample_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "sample/logits_processors.h"
#include "sample/sample_math.h"

namespace pagellm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplerConfig cfg(int32_t vocab, std::vector<int32_t> eos = {}) {
  SamplerConfig c;
  c.vocab_size = vocab;
  c.eos_token_ids = std::move(eos);
  return c;
}

// One edit applied to a raw logit, as the device does it (device_sample.h).
float apply_edit(float raw, const DeviceSampleEdit& e, const DeviceSampleRow& d) {
  float v = raw;
  if (e.flags & kEditBias) v += e.bias;
  if (e.flags & kEditSuppress) v = -kInf;
  if (e.flags & kEditRepetition) {
    float nv =
        v > 0.0f ? std::min(v / d.repetition, FLT_MAX) : std::max(v * d.repetition, -FLT_MAX);
    if (v == -kInf) nv = -kInf;
    v = nv;
  }
  if (e.output_count > 0) v -= static_cast<float>(e.output_count) * d.frequency + d.presence;
  return v;
}

// The CPU Sampler's processing of a row (sampler.cpp, sample_row), for comparison.
std::vector<float> cpu_processed(const std::vector<float>& raw, const SampleRow& row,
                                 const std::vector<int32_t>& eos) {
  const SamplingParams& p = *row.params;
  std::vector<int32_t> suppress;
  if (static_cast<int64_t>(row.output_tokens.size()) < p.min_tokens) {
    suppress = p.stop_token_ids;
    if (!p.ignore_eos) suppress.insert(suppress.end(), eos.begin(), eos.end());
  }
  std::vector<float> x = raw;
  EXPECT_TRUE(apply_logit_bias(x, p.logit_bias).ok());
  EXPECT_TRUE(suppress_tokens(x, suppress).ok());
  EXPECT_TRUE(apply_penalties(x, row.prompt_tokens, row.output_tokens, p.repetition_penalty,
                              p.presence_penalty, p.frequency_penalty)
                  .ok());
  return x;
}

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

TEST(SampleBatch, EditsReproduceTheCpuProcessorsBitForBit) {
  constexpr int32_t kVocab = 300;
  const std::vector<int32_t> eos = {3, 299};
  std::mt19937 rng(20250601);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::uniform_real_distribution<float> val(-8.0f, 8.0f);
  SampleBatchPacker packer(cfg(kVocab, eos));
  int64_t n_checked = 0, n_edits_seen = 0;
  for (int iter = 0; iter < 200; ++iter) {
    const int n_rows = 1 + iter % 7;
    std::vector<SamplingParams> params(n_rows);
    std::vector<std::vector<int32_t>> prompts(n_rows), outputs(n_rows);
    std::vector<std::vector<float>> raws(n_rows);
    std::vector<SampleRow> rows(n_rows);
    std::vector<int64_t> logits_rows(n_rows);
    for (int r = 0; r < n_rows; ++r) {
      SamplingParams& p = params[r];
      const int mode = (iter + r) % 6;  // a mix of processors, some rows with none
      if (mode & 1) {
        std::set<int32_t> used;  // logit_bias tokens are unique (validate())
        for (int j = 0; j < 5; ++j) {
          const int32_t t = tok(rng) % 80;  // overlapping the histories
          if (used.insert(t).second)
            p.logit_bias.push_back({t, std::uniform_real_distribution<float>(-100, 100)(rng)});
        }
      }
      if (mode & 2) {
        p.repetition_penalty = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
        p.frequency_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      }
      if (mode == 4) p.presence_penalty = 0.7f;
      if (mode >= 3) {
        p.min_tokens = 6;
        p.stop_token_ids = {tok(rng), 7};
        p.ignore_eos = (iter % 2) == 0;
      }
      for (int j = 0; j < 20; ++j) prompts[r].push_back(tok(rng) % 60);  // repeats
      const int n_out = iter % 12;
      for (int j = 0; j < n_out; ++j) outputs[r].push_back(tok(rng) % 40);
      raws[r].resize(kVocab);
      for (float& v : raws[r]) v = val(rng);
      raws[r][5] = -kInf;  // masked tokens stay masked under every penalty
      raws[r][6] = 0.0f;
      rows[r] = {&p, prompts[r], outputs[r], 1000u + static_cast<uint64_t>(r)};
      logits_rows[r] = n_rows - 1 - r;
    }
    PackedSampleBatch b;
    packer.pack(rows, logits_rows, b);
    ASSERT_EQ(b.rows.size(), static_cast<size_t>(n_rows));
    for (int r = 0; r < n_rows; ++r) {
      const DeviceSampleRow& d = b.rows[r];
      ASSERT_TRUE(b.host_status[r].ok()) << b.host_status[r].to_string();
      EXPECT_EQ(d.flags & kSampleSkip, 0u);
      EXPECT_EQ(d.logits_row, n_rows - 1 - r);
      EXPECT_EQ(d.step, outputs[r].size());
      EXPECT_EQ(d.seed, 1000u + static_cast<uint64_t>(r));
      ASSERT_LE(d.edit_begin, d.edit_end);
      // Sorted, one entry per token, and only tokens some processor changes.
      for (int32_t e = d.edit_begin + 1; e < d.edit_end; ++e)
        EXPECT_LT(b.edits[e - 1].token, b.edits[e].token);
      std::vector<float> dev = raws[r];
      for (int32_t e = d.edit_begin; e < d.edit_end; ++e) {
        const DeviceSampleEdit& ed = b.edits[e];
        EXPECT_NE(ed.flags | static_cast<uint32_t>(ed.output_count), 0u)
            << "an edit that edits nothing";
        dev[ed.token] = apply_edit(raws[r][ed.token], ed, d);
        ++n_edits_seen;
      }
      const std::vector<float> want = cpu_processed(raws[r], rows[r], eos);
      for (int32_t t = 0; t < kVocab; ++t) {
        ASSERT_TRUE(same_bits(dev[t], want[t]))
            << "iter " << iter << " row " << r << " token " << t << ": packed edits give " << dev[t]
            << ", the CPU processors " << want[t];
        ++n_checked;
      }
    }
  }
  EXPECT_GT(n_edits_seen, 1000);  // the mix really exercised the edits
  EXPECT_GT(n_checked, 0);
}

TEST(SampleBatch, RowFieldsFollowTheParams) {
  SampleBatchPacker packer(cfg(50));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 0;
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.logprobs = 20;
  SamplingParams plain;  // min_p 0: the cut is kExpMinArg, no logprobs
  std::vector<int32_t> out = {1, 2, 3};
  std::vector<SampleRow> rows = {{&greedy, {}, {}, 9}, {&p, {}, out, 11}, {&plain, {}, {}, 12}};
  std::vector<int64_t> lr = {0, 0, 1};
  PackedSampleBatch b;
  packer.pack(rows, lr, b);
  ASSERT_EQ(b.rows.size(), 3u);
  EXPECT_EQ(b.rows[0].flags, kSampleGreedy);
  EXPECT_EQ(b.rows[0].n_logprobs, 0);
  EXPECT_EQ(b.rows[1].flags, 0u);
  EXPECT_EQ(b.rows[1].top_k, 40);
  EXPECT_EQ(b.rows[1].top_p, 0.9f);
  EXPECT_EQ(b.rows[1].temperature, 0.7f);
  EXPECT_EQ(b.rows[1].s_min, std::max(kExpMinArg, std::log(0.05f)));
  EXPECT_EQ(b.rows[1].n_logprobs, 20);
  EXPECT_EQ(b.rows[1].step, 3u);
  EXPECT_EQ(b.rows[1].logits_row, 0);
  EXPECT_EQ(b.rows[2].s_min, kExpMinArg);
  EXPECT_EQ(b.rows[2].n_logprobs, -1);
  EXPECT_EQ(b.rows[2].logits_row, 1);
  EXPECT_TRUE(b.edits.empty());  // no processor touches anything
}

// Grammar masks: each masked row's mask_word finds its own mask in the batch's list, whether the
// masks lay back to back in one buffer (used in place) or apart (copied); unmasked rows have none.
TEST(SampleBatch, GrammarMasksAreListedInPlaceOrCopied) {
  constexpr int32_t kVocab = 70;  // 3 words a mask
  const int64_t words = token_mask_words(kVocab);
  SampleBatchPacker packer(cfg(kVocab));
  SamplingParams p;
  std::vector<uint32_t> together(3 * words), apart(5 * words);
  for (size_t i = 0; i < together.size(); ++i) together[i] = 0x1000u + static_cast<uint32_t>(i);
  for (size_t i = 0; i < apart.size(); ++i) apart[i] = 0x2000u + static_cast<uint32_t>(i);
  auto span_of = [&](std::vector<uint32_t>& v, int64_t i) {
    return std::span<const uint32_t>(v.data() + i * words, static_cast<size_t>(words));
  };
  for (bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "copied");
    std::vector<SampleRow> rows(5, SampleRow{&p, {}, {}, 1});
    std::vector<std::span<const uint32_t>> want(5);
    // Rows 0, 2, 3 masked; in place their masks are 0, 1, 2 of `together`, else 4, 0, 2 of `apart`.
    const int64_t at[3] = {0, 2, 3};
    for (int j = 0; j < 3; ++j) {
      want[at[j]] = in_place ? span_of(together, j) : span_of(apart, (4 + 2 * j) % 6);
      rows[at[j]].allowed = want[at[j]];
    }
    PackedSampleBatch b;
    packer.pack(rows, std::vector<int64_t>{0, 1, 2, 3, 4}, b);
    EXPECT_EQ(b.masks.size(), static_cast<size_t>(3 * words));
    EXPECT_EQ(b.masks.data() == together.data(), in_place);
    EXPECT_EQ(b.mask_store.empty(), in_place);
    for (int k = 0; k < 5; ++k) {
      if (want[k].empty()) {
        EXPECT_EQ(b.rows[k].mask_word, -1) << k;
        continue;
      }
      ASSERT_GE(b.rows[k].mask_word, 0) << k;
      const uint32_t* got = b.inputs().masks + b.rows[k].mask_word;
      EXPECT_TRUE(std::equal(want[k].begin(), want[k].end(), got)) << k;
    }
  }
}

TEST(SampleBatch, MinTokensSuppressesStopIdsAndEosUnlessIgnored) {
  SampleBatchPacker packer(cfg(20, {2, 19}));
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {5};
  SamplingParams q = p;
  q.ignore_eos = true;
  std::vector<int32_t> one = {4}, two = {4, 4};
  std::vector<SampleRow> rows = {{&p, {}, one, 0}, {&q, {}, one, 0}, {&p, {}, two, 0}};
  std::vector<int64_t> lr = {0, 1, 2};
  PackedSampleBatch b;
  packer.pack(rows, lr, b);
  auto tokens = [&](int r) {
    std::vector<int32_t> t;
    for (int32_t e = b.rows[r].edit_begin; e < b.rows[r].edit_end; ++e) {
      EXPECT_EQ(b.edits[e].flags, kEditSuppress);
      t.push_back(b.edits[e].token);
    }
    return t;
  };
  EXPECT_EQ(tokens(0), (std::vector<int32_t>{2, 5, 19}));
  EXPECT_EQ(tokens(1), (std::vector<int32_t>{5}));
  EXPECT_TRUE(tokens(2).empty());  // min_tokens reached
}

// The statuses a row can end with, compared with the CPU Sampler's on the same input.
TEST(SampleBatch, RowErrorsMatchTheCpuSampler) {
  constexpr int32_t kV = 8;
  const SamplerConfig c = cfg(kV, {7});
  Sampler cpu(c);
  SampleBatchPacker packer(c);

  SamplingParams bad_bias;
  bad_bias.logit_bias = {{3, 1.0f}, {kV + 2, 1.0f}};
  SamplingParams penal;
  penal.repetition_penalty = 1.3f;
  SamplingParams presence_only;
  presence_only.presence_penalty = 0.5f;
  SamplingParams must_wait;  // only EOS is finite and min_tokens suppresses it
  must_wait.min_tokens = 3;
  SamplingParams plain;
  std::vector<int32_t> bad_out = {1, -4}, bad_prompt = {kV + 9}, good = {1};
  std::vector<SampleRow> rows = {
      {&bad_bias, {}, {}, 0},                 // 0: out-of-range logit_bias token
      {&penal, {}, bad_out, 0},               // 1: out-of-range output token
      {&penal, bad_prompt, good, 0},          // 2: out-of-range prompt token
      {&presence_only, bad_prompt, good, 0},  // 3: prompt ignored without repetition: fine
      {&plain, {}, {}, 0},                    // 4: NaN at 3 (and +inf at 5)
      {&plain, {}, {}, 0},                    // 5: +inf at 2
      {&plain, {}, {}, 0},                    // 6: every logit -inf
      {&must_wait, {}, {}, 0},                // 7: nothing left after suppression
      {&bad_bias, {}, {}, 0},                 // 8: NaN wins over the bad bias, as on the CPU
  };
  const int n = static_cast<int>(rows.size());
  std::vector<float> logits(n * kV, 0.5f);
  auto at = [&](int r, int t) -> float& { return logits[r * kV + t]; };
  at(4, 3) = std::numeric_limits<float>::quiet_NaN();
  at(4, 5) = kInf;
  at(5, 2) = kInf;
  for (int t = 0; t < kV; ++t) at(6, t) = -kInf;
  for (int t = 0; t < kV; ++t) at(7, t) = t == 7 ? 1.0f : -kInf;
  at(8, 0) = std::numeric_limits<float>::quiet_NaN();
  std::vector<SampleOutput> want(n);
  ASSERT_TRUE(cpu.sample(Tensor(logits.data(), DType::kF32, {n, kV}), rows, want).ok());

  std::vector<int64_t> lr(n);
  for (int r = 0; r < n; ++r) lr[r] = r;
  PackedSampleBatch b;
  packer.pack(rows, lr, b);
  // What the device reports for these rows.
  std::vector<DeviceSampleResult> res(n);
  for (int r = 0; r < n; ++r) res[r].status = DeviceSampleStatus::kOk, res[r].token = 0;
  for (int r : {0, 1, 2}) {
    EXPECT_NE(b.rows[r].flags & kSampleSkip, 0u) << r;
    res[r].status = DeviceSampleStatus::kSkipped;
  }
  EXPECT_EQ(b.rows[3].flags & kSampleSkip, 0u);
  res[4].status = DeviceSampleStatus::kNan, res[4].detail = 3;
  res[5].status = DeviceSampleStatus::kPosInf, res[5].detail = 2;
  res[6].status = DeviceSampleStatus::kAllNegInf;
  res[7].status = DeviceSampleStatus::kNothingToSample;
  res[8].status = DeviceSampleStatus::kNan, res[8].detail = 0;
  EXPECT_NE(b.rows[8].flags & kSampleSkip, 0u);
  std::vector<SampleOutput> got(n);
  SampleBatchPacker::unpack(b, res, got);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[r].status.code(), want[r].status.code()) << "row " << r;
    EXPECT_EQ(got[r].status.message(), want[r].status.message()) << "row " << r;
    if (!want[r].status.ok()) {
      EXPECT_EQ(got[r].token, -1) << "row " << r;
    }
  }
  EXPECT_TRUE(want[3].status.ok());
  EXPECT_FALSE(want[0].status.ok());
  EXPECT_FALSE(want[7].status.ok());
}

TEST(SampleBatch, UnpackCopiesLogprobsOnlyWhenAsked) {
  SampleBatchPacker packer(cfg(10));
  SamplingParams with, without;
  with.logprobs = 2;
  std::vector<SampleRow> rows = {{&with, {}, {}, 0}, {&without, {}, {}, 0}};
  std::vector<int64_t> lr = {0, 1};
  PackedSampleBatch b;
  packer.pack(rows, lr, b);
  std::vector<DeviceSampleResult> res(2);
  for (auto& r : res) {
    r.token = 4;
    r.logprob = -1.25f;
    r.rank = 2;
    r.n_top = 2;
    r.top_token[0] = 6, r.top_logprob[0] = -0.5f;
    r.top_token[1] = 4, r.top_logprob[1] = -1.25f;
  }
  std::vector<SampleOutput> out(2);
  SampleBatchPacker::unpack(b, res, out);
  EXPECT_EQ(out[0].token, 4);
  EXPECT_EQ(out[0].logprob, -1.25f);
  EXPECT_EQ(out[0].rank, 2);
  ASSERT_EQ(out[0].top_logprobs.size(), 2u);
  EXPECT_EQ(out[0].top_logprobs[0].token, 6);
  EXPECT_EQ(out[0].top_logprobs[1].logprob, -1.25f);
  EXPECT_EQ(out[1].token, 4);
  EXPECT_TRUE(std::isnan(out[1].logprob));
  EXPECT_EQ(out[1].rank, 0);
  EXPECT_TRUE(out[1].top_logprobs.empty());
}

}  // namespace
}  // namespace pagellm
