// Table-driven scheduler tests: each row is one engine step (arrivals, aborts, the clock), the
// plan the scheduler must produce ("id:tokens" for sequence 0, "id.seq:tokens" otherwise, in plan
// order), the preemptions, and the requests that finish once the step's tokens are reported.
// Invariants are checked after every step.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace pagellm {
namespace {

struct Arrival {
  RequestId id;
  int prompt_len;
  int max_tokens;
  int n = 1;
  int family = -1;  // prompts of one family (>= 0) share their tokens; else unique to the id
};

struct Row {
  std::vector<Arrival> arrivals;
  std::vector<std::string> expect;      // the plan
  std::vector<RequestId> preempted = {};
  std::vector<RequestId> finished = {};
  std::vector<RequestId> stop = {};     // the engine stops these (all samples) this step
  std::vector<RequestId> aborts = {};   // aborted before planning
  double now_ms = 0.0;
};

std::vector<int32_t> prompt_tokens(const Arrival& a) {
  std::vector<int32_t> t(a.prompt_len);
  const int base = a.family >= 0 ? 100000 * (a.family + 1) : 1000 * static_cast<int>(a.id);
  std::iota(t.begin(), t.end(), base);
  return t;
}

std::string label(const ScheduledSeq& q) {
  std::string s = std::to_string(q.request_id);
  if (q.seq_index != 0) s += "." + std::to_string(q.seq_index);
  return s + ":" + std::to_string(q.token_ids.size());
}

class Harness {
 public:
  Harness(SchedulerConfig sc, KvCacheConfig kc) {
    sc.paranoid = true;
    kc.paranoid = true;
    auto s = Scheduler::create(sc, kc);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    sched = std::move(s.value());
  }

  SchedulePlan step(const Row& row, int index) {
    SCOPED_TRACE("step " + std::to_string(index));
    for (const Arrival& a : row.arrivals) {
      RequestSpec spec{.id = a.id, .prompt = prompt_tokens(a), .max_tokens = a.max_tokens,
                       .n = a.n, .extra_keys = {}, .arrival_ms = row.now_ms};
      Status st = sched->add_request(std::move(spec));
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    for (RequestId id : row.aborts) EXPECT_TRUE(sched->abort(id));
    SchedulePlan plan = sched->schedule(row.now_ms);
    std::vector<std::string> got;
    for (const ScheduledSeq& q : plan.seqs) got.push_back(label(q));
    EXPECT_EQ(got, row.expect);
    EXPECT_EQ(plan.preempted, row.preempted);
    EXPECT_TRUE(plan.failed.empty());
    std::vector<SampledToken> results;
    std::set<RequestId> stop(row.stop.begin(), row.stop.end());
    for (const ScheduledSeq& q : plan.seqs) {
      if (!q.needs_logits) continue;
      for (int j = 0; j < q.n_samples; ++j) {
        results.push_back({.request_id = q.request_id,
                           .seq_index = q.n_samples > 1 ? j : q.seq_index,
                           .token = 7 + j,
                           .finish = stop.count(q.request_id) ? FinishReason::kStop
                                                              : FinishReason::kNone});
      }
    }
    std::vector<RequestId> finished;
    for (const FinishedRequest& f : sched->on_step_done(results)) finished.push_back(f.id);
    EXPECT_EQ(finished, row.finished);
    Status inv = sched->check_invariants();
    EXPECT_TRUE(inv.ok()) << inv.message();
    return plan;
  }

  void run(const std::vector<Row>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) step(rows[i], static_cast<int>(i) + 1);
  }

  std::unique_ptr<Scheduler> sched;
};

SchedulerConfig sched_cfg(int budget, int max_seqs, double watermark = 0.0) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.watermark = watermark;
  return c;
}

KvCacheConfig kv_cfg(int n_blocks, int bs, bool prefix = true) {
  return {.n_blocks = n_blocks, .block_size = bs, .enable_prefix_caching = prefix};
}

TEST(SchedulerTable, ChunkedPrefillThenDecodesFirst) {
  Harness h(sched_cfg(8, 4), kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 10, 3}, {2, 5, 2}}, .expect = {"1:8"}},  // budget 8: R2 waits
      {.arrivals = {}, .expect = {"1:2", "2:5"}},                 // R1's last chunk, R2's prompt
      {.arrivals = {}, .expect = {"1:1", "2:1"}, .finished = {2}},  // R2 hits max_tokens 2
      {.arrivals = {}, .expect = {"1:1"}, .finished = {1}},
      {.arrivals = {}, .expect = {}},
  });
}

TEST(SchedulerTable, DecodesComeBeforeAnOlderRequestsPrefill) {
  Harness h(sched_cfg(8, 4), kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 3, 4}}, .expect = {"1:3"}},
      {.arrivals = {{2, 20, 2}}, .expect = {"1:1", "2:7"}},
      {.arrivals = {}, .expect = {"1:1", "2:7"}},
      {.arrivals = {}, .expect = {"1:1", "2:6"}, .finished = {1}},
      {.arrivals = {}, .expect = {"2:1"}, .finished = {2}},
  });
}

TEST(SchedulerTable, PreemptsTheNewestAndResumesFromTheCachedPrefix) {
  // 6 blocks of 4 tokens; two requests of prompt 8 and 8 new tokens each need 4 blocks apiece.
  Harness h(sched_cfg(16, 4), kv_cfg(6, 4));
  h.run({
      {.arrivals = {{1, 8, 8}, {2, 8, 8}}, .expect = {"1:8", "2:8"}},  // 4 blocks used
      {.arrivals = {}, .expect = {"1:1", "2:1"}},  // position 8: one new block each, pool full
      {.arrivals = {}, .expect = {"1:1", "2:1"}},
      {.arrivals = {}, .expect = {"1:1", "2:1"}},
      {.arrivals = {}, .expect = {"1:1", "2:1"}},  // position 11: blocks 0..2 full, cached
      // R1 needs a block for position 12: R2 (newest) is preempted; its blocks are freed tail
      // first, so R1's new block evicts R2's block 2 and R2's blocks 0, 1 stay cached. R2 cannot
      // come back yet: reviving them leaves no block for the rest of its 13 tokens.
      {.arrivals = {}, .expect = {"1:1"}, .preempted = {2}},
      {.arrivals = {}, .expect = {"1:1"}},
      {.arrivals = {}, .expect = {"1:1"}, .finished = {1}},  // 8 tokens
      // R2 resumes with 8 tokens from the cache and recomputes the other 5 of prompt + outputs.
      {.arrivals = {}, .expect = {"2:5"}},
      {.arrivals = {}, .expect = {"2:1"}},
      {.arrivals = {}, .expect = {"2:1"}, .finished = {2}},
  });
  EXPECT_EQ(h.sched->stats().n_preemptions, 1);
  EXPECT_EQ(h.sched->block_manager().n_free(), 6);
}

TEST(SchedulerTable, FcfsHeadOfLineBlocksSmallerLaterRequests) {
  // 10 blocks, watermark 10% = 1 block. R1 holds 6 blocks; R2 needs 4 (+1 watermark): blocked,
  // and R3 (1 block) must not overtake it.
  Harness h(sched_cfg(64, 4, 0.1), kv_cfg(10, 4));
  h.run({
      {.arrivals = {{1, 24, 3}}, .expect = {"1:24"}},
      {.arrivals = {{2, 16, 2}, {3, 2, 2}}, .expect = {"1:1"}},
      {.arrivals = {}, .expect = {"1:1"}, .finished = {1}},
      {.arrivals = {}, .expect = {"2:16", "3:2"}},
      {.arrivals = {}, .expect = {"2:1", "3:1"}, .finished = {2, 3}},
  });
}

TEST(SchedulerTable, MaxNumSeqsCapsAdmissionAndCountsParallelSamples) {
  Harness h(sched_cfg(64, 3), kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 4, 2, 2}, {2, 4, 2, 2}}, .expect = {"1:4"}},  // 2 + 2 > 3
      {.arrivals = {}, .expect = {"1:1", "1.1:1"}, .finished = {1}},
      {.arrivals = {}, .expect = {"2:4"}},
      {.arrivals = {}, .expect = {"2:1", "2.1:1"}, .finished = {2}},
  });
}

TEST(SchedulerTable, EngineStopAndAbortFinishEarly) {
  Harness h(sched_cfg(64, 4), kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 5, 10}, {2, 5, 10}, {3, 5, 10}}, .expect = {"1:5", "2:5", "3:5"}},
      {.arrivals = {}, .expect = {"1:1", "2:1", "3:1"}, .finished = {2}, .stop = {2}},
      {.arrivals = {}, .expect = {"3:1"}, .aborts = {1}},
      {.arrivals = {}, .expect = {"3:1"}, .finished = {3}, .stop = {3}},
  });
  EXPECT_FALSE(h.sched->has_unfinished());
  EXPECT_EQ(h.sched->block_manager().n_free(), 64);
}

TEST(SchedulerTable, StaticBatchingRunsEachBatchToCompletion) {
  SchedulerConfig c = sched_cfg(64, 8);
  c.batching = *parse_batching_policy("static:2");
  Harness h(c, kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 4, 2}, {2, 4, 3}, {3, 4, 2}}, .expect = {"1:4", "2:4"}},
      {.arrivals = {}, .expect = {"1:1", "2:1"}, .finished = {1}},
      {.arrivals = {}, .expect = {"2:1"}, .finished = {2}},  // R3 waits although it would fit
      {.arrivals = {}, .expect = {"3:4"}},
      {.arrivals = {}, .expect = {"3:1"}, .finished = {3}},
  });
}

TEST(SchedulerTable, DynamicBatchingWaitsForBRequestsOrTMilliseconds) {
  SchedulerConfig c = sched_cfg(64, 8);
  c.batching = *parse_batching_policy("dynamic:2,10");
  Harness h(c, kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 4, 2}}, .expect = {}, .now_ms = 0},
      {.arrivals = {}, .expect = {}, .now_ms = 9.5},
      {.arrivals = {}, .expect = {"1:4"}, .now_ms = 10},            // waited T
      {.arrivals = {{2, 4, 2}, {3, 4, 2}}, .expect = {"1:1"}, .finished = {1}, .now_ms = 11},
      {.arrivals = {}, .expect = {"2:4", "3:4"}, .now_ms = 11.5},   // B are waiting
      {.arrivals = {}, .expect = {"2:1", "3:1"}, .finished = {2, 3}, .now_ms = 12},
  });
}

TEST(SchedulerTable, ContinuousBatchingAdmitsAtOnce) {
  Harness h(sched_cfg(64, 8), kv_cfg(64, 4));
  h.run({
      {.arrivals = {{1, 4, 2}, {2, 4, 3}}, .expect = {"1:4", "2:4"}},
      {.arrivals = {{3, 4, 2}}, .expect = {"1:1", "2:1", "3:4"}, .finished = {1}},
      {.arrivals = {}, .expect = {"2:1", "3:1"}, .finished = {2, 3}},
  });
}

TEST(SchedulerTable, SecondIdenticalPromptComputesOnlyTheUncachedTail) {
  Harness h(sched_cfg(64, 4), kv_cfg(64, 16));
  h.run({
      {.arrivals = {{1, 40, 1, 1, /*family=*/0}}, .expect = {"1:40"}, .finished = {1}},
      // 2 full blocks (32 tokens) cached: only 8 computed.
      {.arrivals = {{2, 40, 1, 1, 0}}, .expect = {"2:8"}, .finished = {2}},
      // Exactly 2 full blocks, both cached: the last is recomputed for the logits.
      {.arrivals = {{3, 32, 1, 1, 0}}, .expect = {"3:16"}, .finished = {3}},
  });
  const PrefixCacheStats& st = h.sched->block_manager().prefix_stats();
  EXPECT_EQ(st.queries, 40 + 40 + 32);
  EXPECT_EQ(st.hits, 32 + 16);
}

TEST(SchedulerTable, PrefixCachingOffRecomputesEverything) {
  Harness h(sched_cfg(64, 4), kv_cfg(64, 16, /*prefix=*/false));
  h.run({
      {.arrivals = {{1, 40, 1, 1, 0}}, .expect = {"1:40"}, .finished = {1}},
      {.arrivals = {{2, 40, 1, 1, 0}}, .expect = {"2:40"}, .finished = {2}},
  });
  EXPECT_EQ(h.sched->block_manager().prefix_stats().queries, 0);
}

// ---------------------------------------------------------------------------------------------
// Focused tests

std::unique_ptr<Scheduler> make(SchedulerConfig sc, KvCacheConfig kc) {
  sc.paranoid = true;
  kc.paranoid = true;
  auto s = Scheduler::create(sc, kc);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s.value());
}

RequestSpec spec(RequestId id, int prompt_len, int max_tokens, int n = 1) {
  RequestSpec s;
  s.id = id;
  s.prompt.resize(prompt_len);
  std::iota(s.prompt.begin(), s.prompt.end(), static_cast<int32_t>(id * 1000));
  s.max_tokens = max_tokens;
  s.n = n;
  return s;
}

TEST(Scheduler, PlanCarriesTokensTablesAndCopyOnWriteForParallelSamples) {
  auto s = make(sched_cfg(64, 8), kv_cfg(16, 4));
  ASSERT_TRUE(s->add_request(spec(1, 6, 2, 3)).ok());
  SchedulePlan p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  const ScheduledSeq& q = p.seqs[0];
  EXPECT_TRUE(q.is_prefill && q.needs_logits);
  EXPECT_EQ(q.n_samples, 3);
  EXPECT_EQ(q.token_ids.size(), 6u);  // positions 0..5: context_len - n_q + i
  EXPECT_EQ(q.block_table, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(q.context_len, 6);
  std::vector<SampledToken> r = {{1, 0, 50}, {1, 1, 51}, {1, 2, 52}};
  EXPECT_TRUE(s->on_step_done(r).empty());
  EXPECT_EQ(s->block_manager().ref_count(0), 3);  // the full block, shared by the 3 samples
  EXPECT_EQ(s->block_manager().ref_count(1), 3);  // the partial one too, until written

  p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 3u);
  // Samples 0 and 1 copy the shared partial block; sample 2, its last holder, writes in place.
  ASSERT_EQ(p.copies.size(), 2u);
  EXPECT_EQ(p.copies[0].src, 1);
  EXPECT_EQ(p.copies[1].src, 1);
  EXPECT_EQ(p.seqs[0].copies, std::vector<BlockCopy>{p.copies[0]});
  EXPECT_EQ(p.seqs[2].block_table, (std::vector<BlockId>{0, 1}));
  for (int j = 0; j < 3; ++j) {
    const ScheduledSeq& d = p.seqs[j];
    EXPECT_EQ(d.seq_index, j);
    EXPECT_FALSE(d.is_prefill);
    EXPECT_EQ(d.token_ids, std::vector<int32_t>{50 + j});
    EXPECT_EQ(d.context_len, 7);  // the token at position 6: slot block_table[1] * 4 + 2
    EXPECT_EQ(d.block_table[0], 0);
    if (j < 2) {
      EXPECT_EQ(d.block_table[1], p.copies[j].dst);
    }
  }
  std::vector<SampledToken> r2 = {{1, 0, 60}, {1, 1, 61}, {1, 2, 62, FinishReason::kStop}};
  auto done = s->on_step_done(r2);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reasons, (std::vector<FinishReason>{FinishReason::kLength,
                                                        FinishReason::kLength,
                                                        FinishReason::kStop}));
  EXPECT_EQ(done[0].n_output_tokens, 6);
  EXPECT_EQ(s->block_manager().n_free(), 16);
}

TEST(Scheduler, RequestLargerThanThePoolIsRefusedAndOthersRun) {
  auto s = make(sched_cfg(64, 8), kv_cfg(4, 4));
  Status st = s->add_request(spec(1, 15, 3));  // 17 tokens with KV: 5 blocks > 4
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs up to 5 KV blocks"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("holds 4 blocks"), std::string::npos);
  // n samples multiply the non-shared part: prompt 8 (2 shared blocks) + 3 samples x 1 block.
  EXPECT_FALSE(s->add_request(spec(2, 8, 4, 3)).ok());
  EXPECT_TRUE(s->add_request(spec(3, 8, 4, 2)).ok());
  EXPECT_TRUE(s->add_request(spec(4, 14, 3)).ok());  // exactly the pool
  EXPECT_EQ(s->n_waiting(), 2);
  for (int i = 0; i < 50 && s->has_unfinished(); ++i) {
    SchedulePlan p = s->schedule();
    EXPECT_TRUE(p.failed.empty());
    std::vector<SampledToken> r;
    for (auto& q : p.seqs) {
      for (int j = 0; j < q.n_samples; ++j) r.push_back({q.request_id, q.n_samples > 1 ? j : q.seq_index, 1});
    }
    s->on_step_done(r);
  }
  EXPECT_FALSE(s->has_unfinished());
}

TEST(Scheduler, BadRequestsAreRefusedWithTheReason) {
  auto s = make(sched_cfg(64, 4), kv_cfg(64, 4));
  EXPECT_NE(s->add_request(spec(1, 0, 3)).message().find("prompt is empty"), std::string::npos);
  EXPECT_NE(s->add_request(spec(1, 4, 0)).message().find("max_tokens"), std::string::npos);
  EXPECT_NE(s->add_request(spec(1, 4, 4, 0)).message().find("n must be"), std::string::npos);
  EXPECT_NE(s->add_request(spec(1, 4, 4, 5)).message().find("max_num_seqs"), std::string::npos);
  ASSERT_TRUE(s->add_request(spec(1, 4, 4)).ok());
  EXPECT_NE(s->add_request(spec(1, 4, 4)).message().find("already in use"), std::string::npos);
}

TEST(Scheduler, WaitingQueueIsBounded) {
  SchedulerConfig c = sched_cfg(64, 1);
  c.max_waiting = 2;
  auto s = make(c, kv_cfg(64, 4));
  ASSERT_TRUE(s->add_request(spec(1, 4, 2)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 4, 2)).ok());
  Status full = s->add_request(spec(3, 4, 2));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("waiting queue is full"), std::string::npos);
  EXPECT_EQ(s->find(3), nullptr);
  SchedulePlan p = s->schedule();  // admits R1 (max_num_seqs 1): one place frees up
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_TRUE(s->add_request(spec(3, 4, 2)).ok());
  EXPECT_EQ(s->add_request(spec(4, 4, 2)).code(), StatusCode::kResourceExhausted);
}

TEST(Scheduler, AbortFreesBlocksAtOnceEvenWithAStepInFlight) {
  auto s = make(sched_cfg(64, 4), kv_cfg(8, 4, /*prefix=*/false));
  ASSERT_TRUE(s->add_request(spec(1, 12, 4)).ok());
  ASSERT_TRUE(s->add_request(spec(2, 4, 4)).ok());
  SchedulePlan p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(s->block_manager().n_used(), 4);
  FinishedRequest info;
  EXPECT_TRUE(s->abort(1, &info));  // mid-step
  EXPECT_EQ(info.state, RequestState::kAborted);
  EXPECT_EQ(info.reasons, std::vector<FinishReason>{FinishReason::kAbort});
  EXPECT_EQ(s->block_manager().n_used(), 1);
  EXPECT_FALSE(s->abort(1));
  // The id may be reused at once; the in-flight step's result for the old R1 is ignored.
  ASSERT_TRUE(s->add_request(spec(1, 4, 4)).ok());
  std::vector<SampledToken> r = {{1, 0, 9}, {2, 0, 9}};
  EXPECT_TRUE(s->on_step_done(r).empty());
  EXPECT_EQ(s->find(1)->state, RequestState::kWaiting);
  EXPECT_EQ(s->find(2)->output(0).size(), 1u);
  EXPECT_TRUE(s->abort(1));  // a waiting request
  EXPECT_TRUE(s->abort(2));
  EXPECT_EQ(s->block_manager().n_free(), 8);
  EXPECT_FALSE(s->has_unfinished());
}

TEST(Scheduler, ConfigAndPolicyErrorsNameTheField) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 4;
  c.max_num_seqs = 8;
  auto r = Scheduler::create(c, kv_cfg(16, 16));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_num_batched_tokens"), std::string::npos);
  EXPECT_FALSE(Scheduler::create(SchedulerConfig{}, kv_cfg(0, 16)).ok());
  SchedulerConfig w;
  w.watermark = 1.0;
  EXPECT_FALSE(Scheduler::create(w, kv_cfg(16, 16)).ok());

  auto cont = parse_batching_policy("continuous");
  ASSERT_TRUE(cont.ok());
  EXPECT_EQ(cont->mode, BatchingMode::kContinuous);
  auto st = parse_batching_policy("static:8");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->batch_size, 8);
  auto dy = parse_batching_policy("dynamic:4,2.5");
  ASSERT_TRUE(dy.ok());
  EXPECT_EQ(dy->batch_size, 4);
  EXPECT_DOUBLE_EQ(dy->max_wait_ms, 2.5);
  EXPECT_EQ(dy->to_string(), "dynamic:4,2.5");
  for (const char* bad : {"", "static", "static:0", "static:x", "dynamic:4", "dynamic:4,",
                          "dynamic:0,1", "dynamic:4,-1", "dynamic:4,nan", "greedy"}) {
    EXPECT_FALSE(parse_batching_policy(bad).ok()) << bad;
  }
}

TEST(SchedulerDeathTest, ScheduleTwiceWithoutResultsIsAProgrammerError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto s = make(sched_cfg(64, 4), kv_cfg(16, 4));
  ASSERT_TRUE(s->add_request(spec(1, 4, 4)).ok());
  (void)s->schedule();
  EXPECT_DEATH((void)s->schedule(), "in flight");
}

RequestSpec spec_of(RequestId id, std::vector<int32_t> prompt, int32_t max_tokens) {
  RequestSpec r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

// Planning ahead: each step's tokens are reported as kPendingToken and their values come one
// step later with resolve_tokens(). A decode planned on a pending token carries it as its input,
// a stop resolved late ends the sequence (the step already planned for it is then ignored), and
// the prefix cache only ever hashes resolved tokens: a later prompt with the same tokens finds
// the blocks.
TEST(SchedulerPlanAhead, PendingTokensResolveBeforeTheirBlocksAreCached) {
  SchedulerConfig sc;
  sc.paranoid = true;
  KvCacheConfig kc{
      .n_blocks = 16, .block_size = 4, .enable_prefix_caching = true, .paranoid = true};
  auto made = Scheduler::create(sc, kc);
  ASSERT_TRUE(made.ok());
  Scheduler& s = **made;
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16};
  ASSERT_TRUE(s.add_request(spec_of(1, prompt, 8)).ok());
  ASSERT_TRUE(s.add_request(spec_of(2, {21, 22, 23}, 8)).ok());
  auto pending = [](const SchedulePlan& plan) {
    std::vector<SampledToken> r;
    for (const ScheduledSeq& q : plan.seqs) r.push_back({q.request_id, q.seq_index, kPendingToken});
    return r;
  };

  SchedulePlan p0 = s.schedule();  // both prompts
  ASSERT_EQ(p0.seqs.size(), 2u);
  ASSERT_TRUE(s.can_plan_ahead());
  EXPECT_TRUE(s.on_step_done(pending(p0)).empty());
  SchedulePlan p1 = s.schedule();  // both decodes, on the pending tokens
  ASSERT_EQ(p1.seqs.size(), 2u);
  for (const ScheduledSeq& q : p1.seqs) EXPECT_EQ(q.token_ids, std::vector<int32_t>{kPendingToken});
  EXPECT_TRUE(s.resolve_tokens(std::vector<SampledToken>{{1, 0, 50}, {2, 0, 60}}).empty());
  EXPECT_EQ(s.find(1)->seqs[0].tokens.back(), 50);
  ASSERT_TRUE(s.can_plan_ahead());
  EXPECT_TRUE(s.on_step_done(pending(p1)).empty());
  SchedulePlan p2 = s.schedule();
  ASSERT_EQ(p2.seqs.size(), 2u);
  // Request 2 stops on its second token, after its third step was planned.
  const auto done =
      s.resolve_tokens(std::vector<SampledToken>{{1, 0, 51}, {2, 0, 61, FinishReason::kStop}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_EQ(done[0].reasons, std::vector<FinishReason>{FinishReason::kStop});
  EXPECT_EQ(done[0].n_output_tokens, 2);
  EXPECT_EQ(s.find(2), nullptr);
  ASSERT_TRUE(s.can_plan_ahead());
  EXPECT_TRUE(s.on_step_done(pending(p2)).empty());  // request 2's result is ignored
  SchedulePlan p3 = s.schedule();
  ASSERT_EQ(p3.seqs.size(), 1u);
  const auto stopped = s.resolve_tokens(std::vector<SampledToken>{{1, 0, 52, FinishReason::kStop}});
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_TRUE(s.on_step_done(pending(p3)).empty());
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(s.stats().kv_usage, 0.0);

  // Request 1 computed 11..16, 50, 51: two full blocks, findable under those tokens.
  std::vector<int32_t> again = prompt;
  again.insert(again.end(), {50, 51, 99});
  ASSERT_TRUE(s.add_request(spec_of(3, again, 1)).ok());
  SchedulePlan p4 = s.schedule();
  ASSERT_EQ(p4.seqs.size(), 1u);
  EXPECT_EQ(s.find(3)->n_cached_tokens, 8);
}

// Planning ahead is refused while a sequence still has prompt to compute or would need a block
// that is not free: the next schedule() could then preempt.
TEST(SchedulerPlanAhead, RefusedWhenTheNextStepCouldPreempt) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 8;  // a 10-token prompt takes two steps
  sc.max_num_seqs = 4;
  sc.paranoid = true;
  KvCacheConfig kc{
      .n_blocks = 4, .block_size = 4, .enable_prefix_caching = false, .paranoid = true};
  auto made = Scheduler::create(sc, kc);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Scheduler& s = **made;
  ASSERT_TRUE(s.add_request(spec_of(1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 5)).ok());
  SchedulePlan p0 = s.schedule();  // the first chunk: no logits, prompt left
  EXPECT_FALSE(s.can_plan_ahead());
  EXPECT_TRUE(s.on_step_done({}).empty());
  SchedulePlan p1 = s.schedule();   // the rest of the prompt, into block 2
  EXPECT_TRUE(s.can_plan_ahead());  // its next token, position 10, fits block 2
  EXPECT_TRUE(s.on_step_done(std::vector<SampledToken>{{1, 0, 11}}).empty());
  // Request 2 takes the last free block; its next token, position 4, would need another.
  ASSERT_TRUE(s.add_request(spec_of(2, {9, 9, 9, 9}, 2)).ok());
  SchedulePlan p2 = s.schedule();
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_FALSE(s.can_plan_ahead());
}

}  // namespace
}  // namespace pagellm
