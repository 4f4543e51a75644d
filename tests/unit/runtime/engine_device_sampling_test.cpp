// The engine's device-sampling path (Backend::supports_sampling), run without a GPU: a backend
// that forwards every op to the CPU backend and answers sample() by the device contract
// (backend/device_sample.h) computed on the host, from the packed rows and edits alone. The same
// requests through the host path (the CPU backend) and through this one must give the same
// tokens, logprobs and finish reasons: the engine packs the right rows (n > 1 samples share their
// prompt's logits row), reads the results back in order, and falls back to the host when a step
// wants prompt logprobs. The kernels themselves are tested against the CPU Sampler in tests/ops.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "backend/backend.h"
#include "byte_tokenizer.h"
#include "forwarding_backend.h"
#include "io/weights.h"
#include "runtime/engine.h"
#include "sample/logits_processors.h"
#include "sample/logprobs.h"
#include "sample/sample_math.h"
#include "sample/sample_rng.h"
#include "source_dir.h"

namespace pagellm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The device contract on the host: edits applied to the raw row, then the CPU's own selection,
// draw and logprob functions.
void sample_by_contract(const Tensor& logits, const DeviceSampleRow& row,
                        const DeviceSampleInputs& in, DeviceSampleResult& r) {
  const DeviceSampleEdit* edits = in.edits;
  const int64_t v = logits.size(1);
  std::span<const float> raw(static_cast<const float*>(logits.row_ptr(row.logits_row)), v);
  r = DeviceSampleResult{};
  for (int64_t t = 0; t < v; ++t) {
    if (!(raw[t] < kInf)) {
      r.status = std::isnan(raw[t]) ? DeviceSampleStatus::kNan : DeviceSampleStatus::kPosInf;
      r.detail = static_cast<int32_t>(t);
      return;
    }
  }
  if (!(max_logit(raw) > -kInf)) {
    r.status = DeviceSampleStatus::kAllNegInf;
    return;
  }
  if (row.flags & kSampleSkip) {
    r.status = DeviceSampleStatus::kSkipped;
    return;
  }
  std::vector<float> x(raw.begin(), raw.end());
  for (int32_t e = row.edit_begin; e < row.edit_end; ++e) {
    const DeviceSampleEdit& ed = edits[e];
    float& y = x[ed.token];
    if (ed.flags & kEditBias) y += ed.bias;
    if (ed.flags & kEditSuppress) y = -kInf;
    if (ed.flags & kEditRepetition) {
      float ny =
          y > 0.0f ? std::min(y / row.repetition, FLT_MAX) : std::max(y * row.repetition, -FLT_MAX);
      if (y == -kInf) ny = -kInf;
      y = ny;
    }
    if (ed.output_count > 0)
      y -= static_cast<float>(ed.output_count) * row.frequency + row.presence;
  }
  if (row.mask_word >= 0) {
    EXPECT_LE(row.mask_word + token_mask_words(v), in.n_mask_words);
    for (int64_t t = 0; t < v; ++t)
      if (!(in.masks[row.mask_word + t / 32] >> (t % 32) & 1u)) x[t] = -kInf;
  }
  int32_t token;
  if (row.flags & kSampleGreedy) {
    token = argmax_token(x);
  } else {
    // The row carries min-p as its cut on s; find the min_p whose cut that is.
    float min_p = 0.0f;
    if (row.s_min != kExpMinArg) {
      min_p = std::exp(row.s_min);
      for (int i = 0; i < 8 && std::log(min_p) != row.s_min; ++i)
        min_p = std::nextafter(min_p, std::log(min_p) < row.s_min ? 2.0f : 0.0f);
      EXPECT_EQ(std::max(kExpMinArg, std::log(min_p)), row.s_min);
    }
    const TruncationParams tp{row.temperature, row.top_k, row.top_p, min_p};
    token = sample_truncated(x, tp, uniform01(row.seed, row.step));
  }
  if (token < 0) {
    r.status = DeviceSampleStatus::kNothingToSample;
    return;
  }
  r.token = token;
  if (row.n_logprobs >= 0) {
    LogprobsResult lp;
    compute_logprobs(raw, token, row.n_logprobs, lp);
    r.logprob = lp.logprob;
    r.rank = lp.rank;
    r.n_top = static_cast<int32_t>(lp.top.size());
    for (size_t j = 0; j < lp.top.size(); ++j) {
      r.top_token[j] = lp.top[j].token;
      r.top_logprob[j] = lp.top[j].logprob;
    }
  }
}

// Every op forwarded to the CPU backend; sample() by the contract, with a record of each call.
class ContractSamplingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  std::string name() const override { return "contract-sampling(" + in_.name() + ")"; }
  bool supports_sampling() const override { return true; }
  void sample(const Tensor& logits, const DeviceSampleInputs& in,
              DeviceSampleResult* out) override {
    EXPECT_EQ(logits.dtype, DType::kF32);
    ++n_calls;
    n_rows_sampled += in.n_rows;
    std::set<int32_t> seen;
    for (int32_t i = 0; i < in.n_rows; ++i) {
      const DeviceSampleRow& row = in.rows[i];
      EXPECT_TRUE(row.edit_begin >= 0 && row.edit_end <= in.n_edits);
      if (!seen.insert(row.logits_row).second) ++n_shared_rows;
      n_masked_rows += row.mask_word >= 0 ? 1 : 0;
      sample_by_contract(logits, row, in, out[i]);
    }
  }
  // The pipelined half (Backend's defaults, counted): how many calls were unread at once, and
  // how often a step took its tokens from a call's results.
  uint64_t sample_async(const Tensor& logits, const DeviceSampleInputs& in) override {
    max_unread = std::max(max_unread, ++unread);
    return Backend::sample_async(logits, in);
  }
  void sample_results(uint64_t ticket, DeviceSampleResult* out) override {
    --unread;
    Backend::sample_results(ticket, out);
  }
  void take_sampled_tokens(Tensor& tokens, uint64_t ticket) override {
    ++n_taken;
    Backend::take_sampled_tokens(tokens, ticket);
  }

  // With `graphs`, a "recording" keeps its function and a replay runs it again (what a replay
  // does on the CPU), so the engine decodes through DecodeGraphs.
  std::unique_ptr<OpGraph> capture(const std::function<void()>& record) override {
    if (!graphs) return Backend::capture(record);
    struct Rerun final : OpGraph {
      std::function<void()> f;
      int64_t* n;
      void replay() override {
        ++*n;
        f();
      }
    };
    auto g = std::make_unique<Rerun>();
    g->f = record;
    g->n = &n_replays;
    return g;
  }

  int64_t n_calls = 0, n_rows_sampled = 0, n_shared_rows = 0, n_masked_rows = 0;
  int64_t unread = 0, max_unread = 0, n_taken = 0;
  bool graphs = false;
  int64_t n_replays = 0;
};

struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::vector<LogprobsResult>> logprobs;
  std::map<int32_t, FinishReason> finish;
  std::vector<LogprobsResult> prompt_logprobs;
  bool done = false;
  Status error;
  int32_t completion_tokens = 0;  // the usage the request_done event reports
};

class EngineDeviceSamplingTest : public testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::move(*ckpt);
    // The plain reference loops: each logit is summed in the same order whatever the step's
    // batch, and the two runs batch requests differently (arrival against the engine's steps),
    // so the fast paths' batch-dependent rounding would make exact comparisons flaky.
    cpu_ = make_cpu_backend(false);
    contract_ = std::make_unique<ContractSamplingBackend>(*cpu_);
    auto m = load_model(ckpt_, *cpu_);  // the model's ops run on the CPU backend either way
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
  }

  // Runs `reqs` together on an engine over `backend`; one Collected per request. Requests listed
  // in `abort` are aborted once their first token is out; *final (optional) gets the engine's
  // stats once every request is done; `tokenizer` (optional) is the engine's.
  std::vector<Collected> run(Backend& backend, const std::vector<EngineRequest>& reqs,
                             const std::set<size_t>& abort = {}, EngineStats* final = nullptr,
                             const Tokenizer* tokenizer = nullptr,
                             const SpeculativeConfig& speculative = {}) {
    EngineConfig cfg;
    cfg.speculative = speculative;
    cfg.scheduler.max_num_seqs = 32;
    cfg.scheduler.max_num_batched_tokens = 40;  // chunked prefills mixed with decodes
    cfg.kv_cache_memory = 8 << 20;
    auto e = Engine::create(*model_, backend, tokenizer, cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::vector<Collected> out(reqs.size());
    if (!e.ok()) return out;
    std::mutex mu;
    std::condition_variable cv;
    size_t n_done = 0;
    std::vector<uint64_t> ids(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      Collected* c = &out[i];
      auto r = (*e)->submit(reqs[i], [&, c](EngineOutput&& o) {
        std::lock_guard<std::mutex> lock(mu);
        if (!o.token_ids.empty()) cv.notify_all();
        for (size_t k = 0; k < o.token_ids.size(); ++k) {
          c->tokens[o.seq_index].push_back(o.token_ids[k]);
          if (k < o.logprobs.size()) c->logprobs[o.seq_index].push_back(o.logprobs[k]);
        }
        if (!o.prompt_logprobs.empty()) c->prompt_logprobs = o.prompt_logprobs;
        if (o.finish != FinishReason::kNone && !o.request_done) c->finish[o.seq_index] = o.finish;
        if (o.request_done) {
          c->done = true;
          c->error = o.error;
          c->completion_tokens = o.completion_tokens;
          ++n_done;
          cv.notify_all();
        }
      });
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      if (r.ok()) ids[i] = *r;
    }
    std::unique_lock<std::mutex> lock(mu);
    for (size_t i : abort) {
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120),
                              [&] { return out[i].done || !out[i].tokens.empty(); }));
      (*e)->abort(ids[i]);
    }
    EXPECT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(120), [&] { return n_done == reqs.size(); }));
    lock.unlock();
    if (final != nullptr) *final = (*e)->stats();
    return out;
  }

  LoadedCheckpoint ckpt_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<ContractSamplingBackend> contract_;
  std::unique_ptr<Model> model_;
};

EngineRequest request(std::vector<int32_t> prompt, uint64_t seed) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = 10;
  r.params.seed = seed;
  r.params.ignore_eos = true;
  r.detokenize = false;
  return r;
}

void expect_same(const std::vector<Collected>& host, const std::vector<Collected>& dev) {
  ASSERT_EQ(host.size(), dev.size());
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_TRUE(host[i].done && dev[i].done) << "request " << i;
    EXPECT_EQ(host[i].error.code(), dev[i].error.code()) << "request " << i;
    EXPECT_EQ(host[i].tokens, dev[i].tokens) << "request " << i;
    EXPECT_EQ(host[i].finish, dev[i].finish) << "request " << i;
    ASSERT_EQ(host[i].logprobs.size(), dev[i].logprobs.size()) << "request " << i;
    for (const auto& [seq, lps] : host[i].logprobs) {
      const auto& d = dev[i].logprobs.at(seq);
      ASSERT_EQ(lps.size(), d.size());
      for (size_t k = 0; k < lps.size(); ++k) {
        EXPECT_EQ(lps[k].logprob, d[k].logprob) << "request " << i << " seq " << seq << " @" << k;
        EXPECT_EQ(lps[k].rank, d[k].rank);
        ASSERT_EQ(lps[k].top.size(), d[k].top.size());
        for (size_t j = 0; j < lps[k].top.size(); ++j) {
          EXPECT_EQ(lps[k].top[j].token, d[k].top[j].token);
          EXPECT_EQ(lps[k].top[j].logprob, d[k].top[j].logprob);
        }
      }
    }
    EXPECT_EQ(host[i].prompt_logprobs.size(), dev[i].prompt_logprobs.size()) << "request " << i;
  }
}

TEST_F(EngineDeviceSamplingTest, SameOutputsAsTheHostSampler) {
  std::vector<EngineRequest> reqs;
  std::vector<int32_t> base = {5, 9, 33, 71, 12, 101, 7, 44, 90, 3, 18, 27};
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt(base.begin(), base.begin() + 3 + i % 9);
    prompt.push_back(20 + i);
    EngineRequest r = request(prompt, 1000 + i);
    SamplingParams& p = r.params;
    switch (i % 6) {
      case 0:
        p.temperature = 0.0f, p.logprobs = 3;
        break;
      case 1:
        p.temperature = 0.9f, p.top_k = 20, p.top_p = 0.9f;
        break;
      case 2:
        p.temperature = 1.2f, p.min_p = 0.05f, p.logprobs = 0;
        break;
      case 3:
        p.repetition_penalty = 1.4f, p.frequency_penalty = 0.6f, p.presence_penalty = 0.3f;
        p.logit_bias = {{17, 5.0f}, {40, -100.0f}};
        break;
      case 4:
        p.n = 3, p.top_p = 0.8f, p.logprobs = 2;
        break;  // three samples of one prompt row
      default:
        p.min_tokens = 4, p.stop_token_ids = {11, 50}, p.ignore_eos = false;
        p.temperature = 0.7f;
        break;
    }
    reqs.push_back(std::move(r));
  }
  const auto host = run(*cpu_, reqs);
  const auto dev = run(*contract_, reqs);
  expect_same(host, dev);
  EXPECT_GT(contract_->n_calls, 0);
  EXPECT_GT(contract_->n_shared_rows, 0) << "n > 1 samples did not share their prompt's row";
  int64_t n_tokens = 0;
  for (const Collected& c : host)
    for (const auto& [seq, t] : c.tokens) n_tokens += static_cast<int64_t>(t.size());
  EXPECT_EQ(contract_->n_rows_sampled, n_tokens) << "every token came from the device path";
}

// Structured output on a device: grammar rows go to the device sampler with their masks (made on
// the host during the forward, after the tokens of a step planned ahead are read), beside
// unconstrained rows in the same call, and give the host path's tokens, logprobs and finish
// reasons.
TEST_F(EngineDeviceSamplingTest, GrammarRowsSampleOnTheDeviceWithTheirMasks) {
  const auto tok = byte_tokenizer();
  auto compiler = GrammarCompiler::create(*tok, 256, {2});
  ASSERT_TRUE(compiler.ok()) << compiler.status().to_string();
  GrammarSpec spec{GrammarKind::kJsonSchema, R"({"type": "object", "properties": {
      "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
      "required": ["ok", "color"], "additionalProperties": false})"};
  spec.any_whitespace = false;  // short enough for the golden Llama's 64-token context
  auto g = (*compiler)->compile(spec);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r = request({5, 9, 33, static_cast<int32_t>(40 + i)}, 300 + i);
    r.params.max_tokens = 40;
    r.params.ignore_eos = false;
    r.params.temperature = i % 4 == 0 ? 0.0f : 1.0f;
    if (i % 3 == 1) r.params.logprobs = 2;
    if (i == 5) r.params.n = 2;
    if (i % 4 != 3) r.grammar = *g;
    reqs.push_back(std::move(r));
  }
  const auto host = run(*cpu_, reqs, {}, nullptr, tok.get());
  EngineStats dev_stats;
  const auto dev = run(*contract_, reqs, {}, &dev_stats, tok.get());
  expect_same(host, dev);
  EXPECT_GT(contract_->n_masked_rows, 0) << "no grammar row reached the device sampler";
  // Grammar steps are planned ahead too: the step before's tokens are read once the forward is
  // queued, before the masks.
  EXPECT_GT(dev_stats.steps_planned_ahead, 0);
  // Every token came from the device path; a step planned ahead also samples a row for a
  // sequence that its last token (not yet read) ended, and drops it.
  int64_t n_tokens = 0;
  for (const Collected& c : host)
    for (const auto& [seq, t] : c.tokens) n_tokens += static_cast<int64_t>(t.size());
  EXPECT_GE(contract_->n_rows_sampled, n_tokens);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!reqs[i].grammar) continue;
    for (const auto& [seq, ids] : dev[i].tokens) {
      std::vector<int32_t> text_ids = ids;
      if (!text_ids.empty() && text_ids.back() == 2) text_ids.pop_back();
      const auto text = tok->decode(text_ids, false);
      ASSERT_TRUE(text.ok());
      EXPECT_FALSE(nlohmann::json::parse(*text, nullptr, false).is_discarded())
          << "request " << i << ": " << *text;
    }
  }
}

// Speculative decoding on a device: a draft model's greedy guesses sampled there (its catch-up
// steps want no logits), the verifying rows sampled there, and the host path's outputs (without
// speculation). A draft model's sampled requests draw their guesses, verified on the host by the
// rejection sampler: their tokens keep the distribution, not the draws, and which draws depends
// on how the steps batched (how many guesses each got), so only their lengths are compared.
TEST_F(EngineDeviceSamplingTest, SpeculativeDecodingSamplesOnTheDevice) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 20 + 3 * i; ++j) prompt.push_back(5 + (j * 7 + i) % 200);  // > 16 tokens
    EngineRequest r = request(prompt, 60 + i);
    r.params.max_tokens = 16;
    r.params.temperature = i % 2 ? 0.7f : 0.0f;
    reqs.push_back(std::move(r));
  }
  for (auto method : {SpeculativeConfig::Method::kDraftModel, SpeculativeConfig::Method::kNgram}) {
    SpeculativeConfig sc;
    sc.method = method;
    sc.draft_model = model_.get();  // the model drafting for itself
    sc.ngram = {1, 3};
    sc.disable_by_batch_size = 0;
    EngineStats st;
    const auto host = run(*cpu_, reqs);
    const auto dev = run(*contract_, reqs, {}, &st, nullptr, sc);
    if (method == SpeculativeConfig::Method::kNgram) {
      expect_same(host, dev);
    } else {
      for (size_t i = 0; i < reqs.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        if (reqs[i].params.temperature == 0.0f) {
          EXPECT_EQ(dev[i].tokens, host[i].tokens);
        } else {
          EXPECT_EQ(dev[i].tokens.at(0).size(), host[i].tokens.at(0).size());
        }
      }
    }
    EXPECT_GT(st.spec_drafts, 0);
    if (method == SpeculativeConfig::Method::kDraftModel) {
      EXPECT_GT(st.spec_accepted_tokens, 0);
    }
  }
}

// On a device, the start-up profile step also runs the sampling kernels once (three rows:
// greedy; top-k, top-p and logprobs; min-p and penalties), so the first request does not load
// them; requests afterwards sample exactly as without it.
TEST_F(EngineDeviceSamplingTest, DeviceEnginesWarmUpSamplingAtStartUp) {
  contract_->report_device(Device::kCuda);
  {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = 32;
    cfg.scheduler.max_num_batched_tokens = 40;
    cfg.kv_cache_memory = 8 << 20;
    auto e = Engine::create(*model_, *contract_, nullptr, cfg);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(contract_->n_calls, 1);
    EXPECT_EQ(contract_->n_rows_sampled, 3);
  }
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = request({5, 9, 33, static_cast<int32_t>(40 + i)}, 77 + i);
    r.params.temperature = i % 2 ? 0.8f : 0.0f;
    reqs.push_back(std::move(r));
  }
  const auto host = run(*cpu_, reqs);
  const auto dev = run(*contract_, reqs);
  expect_same(host, dev);
}

TEST_F(EngineDeviceSamplingTest, PromptLogprobsStepsSampleOnTheHost) {
  std::vector<EngineRequest> reqs;
  EngineRequest a = request({4, 8, 15, 16, 23, 42, 4, 8}, 5);
  a.params.prompt_logprobs = 2;
  a.params.logprobs = 1;
  reqs.push_back(a);
  reqs.push_back(request({7, 7, 7, 9}, 6));
  const auto host = run(*cpu_, reqs);
  const auto dev = run(*contract_, reqs);
  expect_same(host, dev);
  EXPECT_EQ(dev[0].prompt_logprobs.size(), 7u);  // every prompt position after the first
  // The first step held a prompt-logprobs chunk: it sampled on the host; later steps did not.
  int64_t n_tokens = 0;
  for (const Collected& c : dev)
    for (const auto& [seq, t] : c.tokens) n_tokens += static_cast<int64_t>(t.size());
  EXPECT_GT(contract_->n_rows_sampled, 0);
  EXPECT_LT(contract_->n_rows_sampled, n_tokens);
}

// Sampling that reads no earlier token's value (no penalties) lets the engine plan each step
// before the host has read the tokens of the one in flight: they stay on the "device" and the
// next step takes them there (Backend::take_sampled_tokens). Tokens, logprobs, stops (a stop
// token, stop strings' absence, min_tokens, max_tokens), n > 1 and aborts must come out as on
// the host path, step by step, and every block must be free at the end.
TEST_F(EngineDeviceSamplingTest, StepsPlannedAheadGiveTheSameOutputs) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    EngineRequest r = request({5, 9, 33, 71, static_cast<int32_t>(12 + 7 * i)}, 500 + i);
    SamplingParams& p = r.params;
    p.max_tokens = 6 + 2 * i;
    switch (i % 5) {
      case 0:
        p.temperature = 0.0f, p.logprobs = 2;
        break;
      case 1:
        p.temperature = 0.9f, p.top_k = 20;
        break;
      case 2:
        p.n = 2, p.temperature = 1.0f;
        break;
      case 3:
        p.temperature = 0.8f, p.logit_bias = {{17, 3.0f}}, p.min_tokens = 3;
        break;
      default:
        p.temperature = 0.7f, p.top_p = 0.9f, p.logprobs = 1;
        break;
    }
    reqs.push_back(std::move(r));
  }
  // A stop token each request meets mid-stream: its own fourth token, seen on the host path.
  const auto plain = run(*cpu_, reqs);
  for (size_t i = 0; i < reqs.size(); i += 2) {
    ASSERT_GE(plain[i].tokens.at(0).size(), 4u);
    reqs[i].params.stop_token_ids = {plain[i].tokens.at(0)[3]};
  }
  EngineStats dev_stats;
  const auto host = run(*cpu_, reqs);
  const auto dev = run(*contract_, reqs, {}, &dev_stats);
  expect_same(host, dev);
  EXPECT_EQ(contract_->max_unread, 2) << "no step was planned ahead";
  EXPECT_GT(contract_->n_taken, 0);
  EXPECT_GT(dev_stats.steps_planned_ahead, 0);
  EXPECT_EQ(dev_stats.scheduler.kv_usage, 0.0);
  int n_stopped = 0;
  for (size_t i = 0; i < reqs.size(); i += 2) {
    const auto f = dev[i].finish.find(0);
    n_stopped += f != dev[i].finish.end() && f->second == FinishReason::kStop ? 1 : 0;
  }
  EXPECT_GT(n_stopped, 0) << "no request met its stop token";

  // The same through recorded decode steps: the pending tokens reach the replayed step's ids.
  contract_->graphs = true;
  contract_->n_taken = 0;
  const auto replayed = run(*contract_, reqs);
  expect_same(host, replayed);
  EXPECT_GT(contract_->n_replays, 0) << "no decode step was replayed";
  EXPECT_GT(contract_->n_taken, 0);
  contract_->graphs = false;

  // Aborts land while steps are planned ahead: the streams end and every block is free.
  std::vector<EngineRequest> longer;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = request({3, 1, 4, 1, 5, static_cast<int32_t>(9 + i)}, 900 + i);
    r.params.max_tokens = 40;
    r.params.temperature = 0.0f;
    longer.push_back(std::move(r));
  }
  EngineStats abort_stats;
  const auto aborted = run(*contract_, longer, {0, 3, 4}, &abort_stats);
  for (size_t i = 0; i < longer.size(); ++i) {
    EXPECT_TRUE(aborted[i].done) << "request " << i;
    // Usage counts the tokens sent, not one still pending when the abort landed.
    EXPECT_EQ(aborted[i].completion_tokens, static_cast<int32_t>(aborted[i].tokens.at(0).size()))
        << "request " << i;
    if (i == 0 || i == 3 || i == 4) continue;
    EXPECT_EQ(aborted[i].tokens.at(0).size(), 40u) << "request " << i;
  }
  EXPECT_EQ(abort_stats.scheduler.kv_usage, 0.0);
  EXPECT_EQ(abort_stats.scheduler.n_running, 0);
}

}  // namespace
}  // namespace pagellm
