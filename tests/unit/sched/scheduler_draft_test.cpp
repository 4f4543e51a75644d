// Speculative decoding in the scheduler: a decode extended with its draft (Scheduler::set_draft)
// within what the step leaves over, the step's several tokens per sequence taken in order, the
// speculative KV past the right guesses released, and never a preemption, a prompt token or a
// token past max_tokens for a guess. Invariants are checked after every call (paranoid).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "sched/scheduler.h"

namespace pagellm {
namespace {

constexpr int32_t kBlock = 4;

std::unique_ptr<Scheduler> make(int32_t n_blocks, int32_t budget = 64) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = budget;
  sc.max_num_seqs = 2;
  sc.paranoid = true;
  KvCacheConfig kc;
  kc.n_blocks = n_blocks;
  kc.block_size = kBlock;
  kc.paranoid = true;
  auto s = Scheduler::create(sc, kc);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

void add(Scheduler& s, RequestId id, int32_t prompt_len, int32_t max_tokens) {
  std::vector<int32_t> prompt(prompt_len);
  std::iota(prompt.begin(), prompt.end(), 1000 * static_cast<int32_t>(id));
  RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(prompt);
  spec.max_tokens = max_tokens;
  const Status st = s.add_request(std::move(spec));
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// Runs the prompt steps of every waiting request, each sampling token 1.
void prefill(Scheduler& s) {
  SchedulePlan p = s.schedule();
  std::vector<SampledToken> r;
  for (const ScheduledSeq& q : p.seqs)
    if (q.needs_logits) r.push_back({q.request_id, q.seq_index, 1, FinishReason::kNone});
  s.on_step_done(r);
}

const Sequence& seq(const Scheduler& s, RequestId id) {
  return s.find(id)->seqs[0];
}

TEST(SchedulerDraft, ADecodeVerifiesItsDraftAndKeepsTheRightGuesses) {
  auto s = make(16);
  add(*s, 1, 6, 20);
  prefill(*s);  // tokens: 6 prompt + [1]; 6 computed
  const std::vector<int32_t> draft = {5, 6, 7};
  s->set_draft(1, 0, draft);
  SchedulePlan p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  const ScheduledSeq& q = p.seqs[0];
  EXPECT_EQ(q.token_ids, (std::vector<int32_t>{1, 5, 6, 7}));
  EXPECT_EQ(q.n_draft, 3);
  EXPECT_EQ(q.context_len, 10);
  EXPECT_TRUE(q.needs_logits);
  EXPECT_EQ(q.block_table.size(), 3u);  // positions 0..9
  EXPECT_FALSE(s->can_plan_ahead());
  // Two guesses right (5, 6), then the model's 9 instead of 7.
  const std::vector<SampledToken> r = {{1, 0, 5, FinishReason::kNone},
                                       {1, 0, 6, FinishReason::kNone},
                                       {1, 0, 9, FinishReason::kNone}};
  EXPECT_TRUE(s->on_step_done(r).empty());
  const Sequence& sq = seq(*s, 1);
  EXPECT_EQ(std::vector<int32_t>(sq.tokens.begin() + 6, sq.tokens.end()),
            (std::vector<int32_t>{1, 5, 6, 9}));
  EXPECT_EQ(sq.n_computed, 9);  // KV of positions 0..8: the prompt, 1, 5, 6
  EXPECT_EQ(sq.table.n_blocks(), 3);
  // The next step decodes the 9 alone (no draft given), at position 9.
  SchedulePlan next = s->schedule();
  ASSERT_EQ(next.seqs.size(), 1u);
  EXPECT_EQ(next.seqs[0].token_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(next.seqs[0].n_draft, 0);
  EXPECT_EQ(next.seqs[0].context_len, 10);
}

TEST(SchedulerDraft, EveryGuessWrongReleasesTheirBlocks) {
  auto s = make(16);
  add(*s, 1, 3, 20);
  prefill(*s);  // 3 computed, one block
  const int32_t free_before = s->block_manager().n_free();
  const std::vector<int32_t> draft = {5, 6, 7, 8, 9, 10};
  s->set_draft(1, 0, draft);
  SchedulePlan p = s->schedule();
  EXPECT_EQ(p.seqs[0].n_draft, 6);  // positions 3..9: two more blocks
  EXPECT_EQ(s->block_manager().n_free(), free_before - 2);
  s->on_step_done(std::vector<SampledToken>{{1, 0, 42, FinishReason::kNone}});
  EXPECT_EQ(seq(*s, 1).n_computed, 4);
  EXPECT_EQ(s->block_manager().n_free(), free_before);  // positions 0..3: the first block
}

TEST(SchedulerDraft, AllGuessesRightAndTheBonusToken) {
  auto s = make(16);
  add(*s, 1, 4, 20);
  prefill(*s);
  const std::vector<int32_t> draft = {5, 6};
  s->set_draft(1, 0, draft);
  s->schedule();
  s->on_step_done(std::vector<SampledToken>{{1, 0, 5, FinishReason::kNone},
                                            {1, 0, 6, FinishReason::kNone},
                                            {1, 0, 8, FinishReason::kNone}});
  const Sequence& sq = seq(*s, 1);
  EXPECT_EQ(sq.n_tokens(), 4 + 4);
  EXPECT_EQ(sq.n_computed, 7);
}

TEST(SchedulerDraft, GuessesStopShortOfMaxTokensTheBudgetAndTheFreeBlocks) {
  {  // max_tokens 4, one token out: 3 more at most, so 2 guesses (+ the model's token).
    auto s = make(16);
    add(*s, 1, 4, 4);
    prefill(*s);
    const std::vector<int32_t> draft = {5, 6, 7, 8};
    s->set_draft(1, 0, draft);
    EXPECT_EQ(s->schedule().seqs[0].n_draft, 2);
  }
  {  // A budget of 3 tokens: the decode and 2 guesses.
    auto s = make(16, 3);
    add(*s, 1, 2, 20);
    prefill(*s);
    const std::vector<int32_t> draft = {5, 6, 7, 8};
    s->set_draft(1, 0, draft);
    EXPECT_EQ(s->schedule().seqs[0].n_draft, 2);
  }
  {  // Four blocks; request 2 holds two, request 1 one (positions 0..3): one block is left,
     // for 4 of request 1's guesses (positions 4..7), and request 2 gets none, with no
     // preemption.
    auto s = make(4);
    add(*s, 1, 3, 13);
    add(*s, 2, 6, 2);
    prefill(*s);
    const std::vector<int32_t> draft = {5, 6, 7, 8, 9, 10, 11, 12};
    s->set_draft(1, 0, draft);
    s->set_draft(2, 0, draft);
    SchedulePlan p = s->schedule();
    EXPECT_TRUE(p.preempted.empty());
    ASSERT_EQ(p.seqs.size(), 2u);
    EXPECT_EQ(p.seqs[0].n_draft, 4);
    EXPECT_EQ(p.seqs[1].n_draft, 0);
    EXPECT_EQ(s->block_manager().n_free(), 0);
  }
}

TEST(SchedulerDraft, GuessesNeverTakeAPromptsPlace) {
  // Request 2's prompt arrives as 1 decodes: its chunk is planned first, the guesses get the
  // budget it leaves (10 - 1 - 8 = 1).
  auto s = make(64, 10);
  add(*s, 1, 3, 20);
  prefill(*s);
  add(*s, 2, 8, 20);
  const std::vector<int32_t> draft = {5, 6, 7};
  s->set_draft(1, 0, draft);
  SchedulePlan p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].request_id, 1u);
  EXPECT_EQ(p.seqs[0].n_draft, 1);
  EXPECT_EQ(p.seqs[1].token_ids.size(), 8u);
}

TEST(SchedulerDraft, DraftsOnlyForRunningDecodesAndOnlyForOneStep) {
  auto s = make(16);
  add(*s, 1, 3, 20);
  const std::vector<int32_t> draft = {5, 6};
  s->set_draft(1, 0, draft);  // waiting: ignored
  SchedulePlan p = s->schedule();
  EXPECT_EQ(p.seqs[0].n_draft, 0);
  s->on_step_done(std::vector<SampledToken>{{1, 0, 1, FinishReason::kNone}});
  s->set_draft(1, 0, draft);
  s->set_draft(9, 0, draft);  // unknown: ignored
  s->set_draft(1, 3, draft);  // no such sequence: ignored
  EXPECT_EQ(s->schedule().seqs[0].n_draft, 2);
  s->on_step_done(std::vector<SampledToken>{{1, 0, 3, FinishReason::kNone}});
  EXPECT_EQ(s->schedule().seqs[0].n_draft, 0);  // not given again
}

TEST(SchedulerDraft, AStopAmongTheRightGuessesEndsTheSequence) {
  auto s = make(16);
  add(*s, 1, 3, 20);
  prefill(*s);
  const std::vector<int32_t> draft = {5, 6, 7};
  s->set_draft(1, 0, draft);
  s->schedule();
  // The engine stopped at the first guess (a stop token): one token, finished.
  auto done = s->on_step_done(std::vector<SampledToken>{{1, 0, 5, FinishReason::kStop}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reasons[0], FinishReason::kStop);
  EXPECT_EQ(s->block_manager().n_free(), 16);
}

TEST(SchedulerDraft, AbortedWhileVerifyingFreesEverything) {
  auto s = make(16);
  add(*s, 1, 3, 20);
  prefill(*s);
  const std::vector<int32_t> draft = {5, 6, 7, 8, 9};
  s->set_draft(1, 0, draft);
  s->schedule();
  EXPECT_TRUE(s->abort(1));
  EXPECT_EQ(s->block_manager().n_free(), 16);
  EXPECT_TRUE(s->on_step_done(std::vector<SampledToken>{{1, 0, 5, FinishReason::kNone}}).empty());
}

TEST(SchedulerDraft, PrefixCacheRegistersOnlyTheRightGuesses) {
  auto s = make(16);
  add(*s, 1, 3, 20);
  prefill(*s);  // [1000 1001 1002 | 1]
  const std::vector<int32_t> draft = {5, 6, 7, 8};
  s->set_draft(1, 0, draft);
  s->schedule();
  // 5 right; 6 wrong: the tokens are [1000 1001 1002 1 | 5 4], computed up to 5.
  s->on_step_done(
      std::vector<SampledToken>{{1, 0, 5, FinishReason::kNone}, {1, 0, 4, FinishReason::kNone}});
  EXPECT_EQ(seq(*s, 1).table.n_registered(), 1);  // block 0 full of known tokens; block 1 not
  EXPECT_EQ(seq(*s, 1).n_computed, 5);
}

TEST(SchedulerDraftDeathTest, ATokenThatIsNotTheGuessIsAnEngineBug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto s = make(16);
  add(*s, 1, 3, 20);
  prefill(*s);
  const std::vector<int32_t> draft = {5, 6};
  s->set_draft(1, 0, draft);
  s->schedule();
  EXPECT_DEATH(s->on_step_done(std::vector<SampledToken>{{1, 0, 4, FinishReason::kNone},
                                                         {1, 0, 6, FinishReason::kNone}}),
               "not the guess");
}

}  // namespace
}  // namespace pagellm
