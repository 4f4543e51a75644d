// Randomized stress test: thousands of requests with random prompt and output lengths, shared
// prompt prefixes, n > 1, random aborts and engine stops, under a pool small enough to force
// preemption. A simulated KV store plays the device: it executes each plan's block copies and
// writes (token, position) into the planned slots, and before every step checks that each
// scheduled sequence's context slots hold exactly its own tokens at their positions, which is what
// attention would read. At the end every request has finished or was aborted by the test, none was
// failed by the scheduler, and the pool is entirely free again. The plan-ahead scenarios report a
// step's tokens as pending whenever the scheduler allows it (Scheduler::can_plan_ahead) and
// resolve them, stops included, after the next step is planned, as the engine does on a device;
// the simulated device then writes the pending token's value, which the host learns only later.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/scheduler.h"

namespace pagellm {
namespace {

struct StressParams {
  const char* name;
  int block_size;
  int n_blocks;
  bool prefix_caching;
  const char* batching;
  int n_requests;
  unsigned seed;
  bool expect_pressure = true;  // the scenario must preempt, copy and fill the waiting queue
  bool plan_ahead = false;      // report tokens as pending where the scheduler allows it
};

// The values of tokens reported as kPendingToken, by (request, sequence): what the device knows.
using PendingValues = std::map<std::pair<RequestId, int32_t>, SampledToken>;

void PrintTo(const StressParams& p, std::ostream* os) { *os << p.name; }

class KvSim {
 public:
  KvSim(int n_blocks, int bs) : bs_(bs), cell_(static_cast<size_t>(n_blocks) * bs, {-1, -1}) {}

  // Checks the plan against the scheduler's view and the simulated cache, then "runs" it; a
  // pending input token is written with its value from `pending`.
  void run(const SchedulePlan& plan, const Scheduler& s, const PendingValues& pending) {
    const BlockManager& mgr = s.block_manager();
    // Copies can run as one batch: destinations are distinct and never a source.
    std::set<BlockId> srcs, dsts;
    for (const BlockCopy& c : plan.copies) {
      srcs.insert(c.src);
      ASSERT_TRUE(dsts.insert(c.dst).second) << "block copied into twice";
      ASSERT_EQ(mgr.ref_count(c.dst), 1);
    }
    for (BlockId d : dsts) ASSERT_FALSE(srcs.count(d)) << "block " << d << " is source and target";
    for (const BlockCopy& c : plan.copies) {
      for (int i = 0; i < bs_; ++i) cell_[c.dst * bs_ + i] = cell_[c.src * bs_ + i];
    }
    std::set<int32_t> written;
    std::set<RequestId> preempted(plan.preempted.begin(), plan.preempted.end());
    int n_tokens = 0;
    for (const ScheduledSeq& q : plan.seqs) {
      SCOPED_TRACE("request " + std::to_string(q.request_id) + "." + std::to_string(q.seq_index));
      ASSERT_FALSE(preempted.count(q.request_id));
      const Request* r = s.find(q.request_id);
      ASSERT_NE(r, nullptr);
      ASSERT_EQ(r->state, RequestState::kRunning);
      const Sequence& seq = r->seqs[q.seq_index];
      const int n = static_cast<int>(q.token_ids.size());
      ASSERT_GE(n, 1);
      n_tokens += n;
      const int start = q.context_len - n;
      ASSERT_GE(start, 0);
      ASSERT_EQ(q.block_table, seq.table.blocks());
      ASSERT_EQ(q.needs_logits, q.context_len == seq.n_tokens());
      // What attention reads: every earlier position holds this sequence's token.
      for (int p = 0; p < start; ++p) {
        ASSERT_EQ(cell_[slot(q, p)].first, seq.tokens[p]) << "position " << p;
        ASSERT_EQ(cell_[slot(q, p)].second, p) << "position " << p;
      }
      for (int i = 0; i < n; ++i) {
        const int p = start + i;
        ASSERT_EQ(q.token_ids[i], seq.tokens[p]);
        ASSERT_TRUE(written.insert(slot(q, p)).second) << "slot written twice in one step";
        // Never write into a block someone else can read (that is what copy-on-write is for).
        ASSERT_EQ(mgr.ref_count(q.block_table[p / bs_]), 1) << "write into a shared block";
      }
    }
    ASSERT_EQ(n_tokens, plan.n_tokens);
    ASSERT_LE(n_tokens, s.config().max_num_batched_tokens);
    for (const ScheduledSeq& q : plan.seqs) {
      const int n = static_cast<int>(q.token_ids.size());
      for (int i = 0; i < n; ++i) {
        const int p = q.context_len - n + i;
        int32_t token = q.token_ids[i];
        if (token == kPendingToken) {
          const auto it = pending.find({q.request_id, q.seq_index});
          ASSERT_NE(it, pending.end()) << "a pending input token nobody sampled";
          token = it->second.token;
        }
        cell_[slot(q, p)] = {token, p};
      }
    }
  }

 private:
  // Where position p of q's sequence keeps its KV (what the engine's step batch computes).
  int32_t slot(const ScheduledSeq& q, int p) const {
    return q.block_table[p / bs_] * bs_ + p % bs_;
  }

  int bs_;
  std::vector<std::pair<int32_t, int32_t>> cell_;  // [n_blocks * bs] (token, position)
};

class SchedulerStress : public ::testing::TestWithParam<StressParams> {};

TEST_P(SchedulerStress, EverythingFinishesAndThePoolIsFreeAgain) {
  const StressParams& P = GetParam();
  SCOPED_TRACE("seed " + std::to_string(P.seed));
  std::mt19937 rng(P.seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };

  SchedulerConfig sc;
  sc.max_num_batched_tokens = 48;
  sc.max_num_seqs = 10;
  sc.max_waiting = 24;
  sc.watermark = 0.05;
  sc.paranoid = true;
  auto policy = parse_batching_policy(P.batching);
  ASSERT_TRUE(policy.ok());
  sc.batching = *policy;
  KvCacheConfig kc{.n_blocks = P.n_blocks, .block_size = P.block_size,
                   .enable_prefix_caching = P.prefix_caching, .paranoid = true};
  auto created = Scheduler::create(sc, kc);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Scheduler& s = **created;
  KvSim sim(P.n_blocks, P.block_size);

  // Prompts: a random prefix of one of 4 shared "system prompts", then random tokens.
  std::vector<std::vector<int32_t>> families(4);
  for (auto& f : families) {
    f.resize(64);
    for (int32_t& t : f) t = uni(0, 50);
  }
  const int max_prompt = 10 * P.block_size;
  auto make_spec = [&](RequestId id) {
    RequestSpec spec;
    spec.id = id;
    int len = uni(1, max_prompt);
    int shared = coin(0.6) ? uni(0, std::min(len, 64)) : 0;
    const auto& fam = families[uni(0, 3)];
    for (int i = 0; i < len; ++i) spec.prompt.push_back(i < shared ? fam[i] : uni(0, 50));
    spec.max_tokens = uni(1, 6 * P.block_size);
    spec.n = coin(0.2) ? uni(2, 3) : 1;
    if (coin(0.05)) spec.extra_keys = {static_cast<uint64_t>(uni(1, 2))};  // a LoRA id
    return spec;
  };

  std::vector<RequestSpec> retry;  // refused with 429: the client tries again later
  std::set<RequestId> live, aborted_by_us, finished;
  int n_added = 0, n_refused_full = 0, n_too_large = 0, n_preempted = 0, n_cow = 0;
  int n_sibling_recompute = 0, n_ahead = 0, n_late_stops = 0;
  PendingValues pending;  // the last step's tokens, when it was planned ahead
  RequestId next_id = 1;
  int step = 0;
  const int max_steps = 200000;
  for (; step < max_steps; ++step) {
    const bool arrivals_left = n_added < P.n_requests;
    if (!arrivals_left && retry.empty() && !s.has_unfinished()) break;
    // Arrivals (first the ones that were refused).
    // Clients back off while requests are being refused with 429.
    int k = arrivals_left && retry.size() < 4 ? std::min(uni(0, 2), P.n_requests - n_added) : 0;
    std::vector<RequestSpec> batch;
    batch.swap(retry);
    for (int i = 0; i < k; ++i) {
      batch.push_back(make_spec(next_id++));
      ++n_added;
    }
    if (arrivals_left && coin(0.01)) {  // now and then a prompt that can never fit
      RequestSpec big = make_spec(next_id++);
      big.prompt.assign(static_cast<size_t>(P.n_blocks) * P.block_size + 1, 3);
      Status st = s.add_request(std::move(big));
      ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      ++n_too_large;
    }
    for (RequestSpec& spec : batch) {
      spec.arrival_ms = step;
      RequestId id = spec.id;
      RequestSpec copy = spec;
      Status st = s.add_request(std::move(spec));
      if (st.code() == StatusCode::kResourceExhausted) {
        ++n_refused_full;
        retry.push_back(std::move(copy));
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.to_string();
      live.insert(id);
    }
    // Random aborts (a client disconnects).
    if (!live.empty() && coin(0.03)) {
      auto it = live.begin();
      std::advance(it, uni(0, static_cast<int>(live.size()) - 1));
      RequestId id = *it;
      ASSERT_TRUE(s.abort(id));
      live.erase(id);
      aborted_by_us.insert(id);
    }

    SchedulePlan plan = s.schedule(static_cast<double>(step));
    ASSERT_TRUE(plan.failed.empty()) << "request " << plan.failed[0].id << ": "
                                     << plan.failed[0].error;
    n_preempted += static_cast<int>(plan.preempted.size());
    n_cow += static_cast<int>(plan.copies.size());
    for (const ScheduledSeq& q : plan.seqs) n_sibling_recompute += q.seq_index > 0 && q.is_prefill;
    sim.run(plan, s, pending);
    if (HasFatalFailure()) return;
    // Planned ahead: the step before's tokens reach the host now, after this step was planned.
    if (!pending.empty()) {
      std::vector<SampledToken> values;
      for (const auto& [key, t] : pending) {
        values.push_back(t);
        n_late_stops += t.finish != FinishReason::kNone;
      }
      pending.clear();
      for (const FinishedRequest& f : s.resolve_tokens(values)) {
        ASSERT_EQ(f.state, RequestState::kFinished);
        ASSERT_TRUE(live.erase(f.id));
        finished.insert(f.id);
      }
    }

    std::vector<SampledToken> results;
    for (const ScheduledSeq& q : plan.seqs) {
      if (!q.needs_logits) continue;
      for (int j = 0; j < q.n_samples; ++j) {
        results.push_back({.request_id = q.request_id,
                           .seq_index = q.n_samples > 1 ? j : q.seq_index,
                           .token = uni(0, 7),  // tiny vocabulary: samples often coincide
                           .finish = coin(0.03) ? FinishReason::kStop : FinishReason::kNone});
      }
    }
    if (P.plan_ahead && s.can_plan_ahead() && coin(0.8)) {
      ++n_ahead;
      for (SampledToken& t : results) {
        pending[{t.request_id, t.seq_index}] = t;
        t.token = kPendingToken;
        t.finish = FinishReason::kNone;
      }
    }
    // Sometimes a client disconnects while the step runs.
    if (!plan.seqs.empty() && coin(0.01)) {
      RequestId id = plan.seqs[uni(0, static_cast<int>(plan.seqs.size()) - 1)].request_id;
      if (live.count(id)) {  // not stopped by the tokens resolved since it was planned
        ASSERT_TRUE(s.abort(id));
        live.erase(id);
        aborted_by_us.insert(id);
      }
    }
    for (const FinishedRequest& f : s.on_step_done(results)) {
      ASSERT_EQ(f.state, RequestState::kFinished);
      for (FinishReason reason : f.reasons) ASSERT_NE(reason, FinishReason::kNone);
      ASSERT_TRUE(live.erase(f.id));
      finished.insert(f.id);
    }
    Status inv = s.check_invariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv.message();
    // The engine hands every plan back; every other step here, so the next plans are built both
    // in recycled buffers (stale tokens, tables and copies to overwrite) and in fresh ones.
    if (step % 2 == 0) s.recycle(std::move(plan));
  }
  ASSERT_LT(step, max_steps) << "requests starved or the scheduler spun";

  EXPECT_TRUE(live.empty());
  EXPECT_EQ(static_cast<int>(finished.size() + aborted_by_us.size()), P.n_requests);
  const BlockManager& mgr = s.block_manager();
  EXPECT_EQ(mgr.n_free(), P.n_blocks);
  for (BlockId b = 0; b < P.n_blocks; ++b) ASSERT_EQ(mgr.ref_count(b), 0);
  ASSERT_TRUE(mgr.check_invariants().ok());
  // The scenario must actually exercise what it claims to.
  if (P.expect_pressure) {
    EXPECT_GT(n_preempted, 0);
    EXPECT_GT(n_refused_full, 0);
  }
  if (P.block_size > 1) {
    EXPECT_GT(n_cow, 0);  // with 1-token blocks no block is ever partial
  }
  if (P.expect_pressure) {
    EXPECT_GT(n_sibling_recompute, 0);  // samples of n > 1 requests resumed after preemption
  }
  if (P.prefix_caching) {
    EXPECT_GT(mgr.prefix_stats().hits, 0);
    EXPECT_GT(mgr.prefix_stats().evictions, 0);
  }
  if (P.plan_ahead) {
    EXPECT_GT(n_ahead, step / 10);
    EXPECT_GT(n_late_stops, 0);
  }
  std::printf(
      "[ stress   ] %s: %d requests (%zu finished, %zu aborted), %d steps, %d preemptions, "
      "%d copies, %d resumed-sample chunks, %d refused (queue full), %d refused (too large), "
      "prefix hits %lld/%lld tokens, %d steps planned ahead\n",
      P.name, P.n_requests, finished.size(), aborted_by_us.size(), step, n_preempted, n_cow,
      n_sibling_recompute, n_refused_full, n_too_large,
      static_cast<long long>(mgr.prefix_stats().hits),
      static_cast<long long>(mgr.prefix_stats().queries), n_ahead);
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, SchedulerStress,
    ::testing::Values(
        // Worst case of one request (prompt 10 blocks, 6 blocks of output, n = 3): 28 blocks.
        StressParams{"continuous_prefix_bs4", 4, 48, true, "continuous", 3000, 1},
        StressParams{"continuous_noprefix_bs4", 4, 48, false, "continuous", 2000, 2},
        StressParams{"continuous_prefix_bs16", 16, 32, true, "continuous", 1500, 3},
        StressParams{"continuous_prefix_bs1", 1, 40, true, "continuous", 800, 4, false},
        StressParams{"static4", 4, 48, true, "static:4", 600, 5, false},
        StressParams{"dynamic4_3ms", 4, 48, true, "dynamic:4,3", 600, 6, false},
        StressParams{"ahead_prefix_bs4", 4, 48, true, "continuous", 3000, 7, true, true},
        StressParams{"ahead_prefix_bs16", 16, 32, true, "continuous", 1500, 8, true, true},
        StressParams{"ahead_noprefix_bs1", 1, 40, false, "continuous", 800, 9, false, true}),
    [](const ::testing::TestParamInfo<StressParams>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace pagellm
