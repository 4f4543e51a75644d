// Scheduler: decides, step by step, which sequences run and which tokens each computes, within a
// token budget and the KV block pool. Pure bookkeeping: no device, no model. It is a function of
// (its state, the step budget, a clock value) -> SchedulePlan; the engine runs the plan's forward,
// samples, and reports the sampled tokens back with on_step_done().
//
// Engine loop (one thread; every call below is made from it):
//     add_request(spec)        -> error: kResourceExhausted (waiting queue full: HTTP 429),
//                                 kInvalidArgument (bad or never-fitting request: HTTP 400)
//     abort(id)                   any time between calls; frees the request's blocks at once
//     plan = schedule(now_ms)
//     if (!plan.seqs.empty()):
//         execute plan.copies (block src -> dst, all layers, K and V / the MLA latent) first;
//             they may run as one batch: destinations are distinct and none is also a source
//         build AttentionMeta from plan.seqs, in order:
//             cu_seqlens_q     prefix sums of seqs[i].token_ids.size()
//             seq_lens_kv[i]   seqs[i].context_len
//             block_tables[i]  seqs[i].block_table, padded to the widest row
//             positions        each token's position (context_len - n_q + i: RoPE)
//             slot_mapping     each token's KV slot, from its position and block_table
//                              (rope_store_kv)
//         forward; take logits of the last token of every seq with needs_logits
//         sample seqs[i].n_samples tokens from that row (n_samples > 1 only for the first sample
//             of an n > 1 request: sample j goes to sequence j), decide stop conditions
//         finished = on_step_done(sampled tokens)   (stream deltas; finished requests are gone)
//     report plan.failed (requests the scheduler gave up on, with a reason) and plan.preempted
// Planning ahead (an engine whose tokens stay on its device until read): when can_plan_ahead()
// after a step is queued, on_step_done() gets kPendingToken for each of its tokens, the next
// plan takes them as its decodes' inputs, and once that next step is queued the engine reads the
// tokens and reports their values and stop decisions with resolve_tokens(), before that next
// step's on_step_done().
//
// Speculative decoding: before schedule(), set_draft() gives a decoding sequence the tokens a
// proposer guesses will follow its last one. Once decodes, prefill chunks and admissions are
// planned, the budget and free blocks left over extend decodes with their guesses (never a
// preemption or a prompt's token for a guess); such a step verifies them, and on_step_done() takes
// several tokens for that sequence, in order: the guesses that were right, then the one the
// model chose after them. The KV of the guesses that were wrong is dropped. No planning ahead
// of a step that verifies guesses.
// Policy (continuous batching, the default):
//   1. Decodes first: every running sequence whose next token is its last sampled one computes 1
//      token (while the budget lasts).
//   2. Then chunked prefill of running requests (a prompt, or prompt + outputs being recomputed
//      after preemption), oldest first, each chunk as large as the remaining budget and the free
//      blocks allow.
//   3. Then admission of waiting requests in FCFS order, while the budget, max_num_seqs and the
//      free blocks (keeping `watermark` of the pool free) allow; the first request that does not
//      fit stops admission (no overtaking, so nobody starves). No admission in a step that had to
//      preempt. An admitted request first takes its longest cached prefix from the prefix cache.
//   Out of blocks for a running sequence: preempt the newest running request (recompute: free its
//   blocks, put it back in the waiting queue in arrival order), repeatedly, possibly itself. The
//   oldest running request can always preempt all others, so a request that still cannot get a
//   block when it is alone can never fit: it is failed (kAbort, reason in `error`), not retried.
//   add_request already refuses requests whose worst case exceeds the pool.
// Static ("static:B") and dynamic ("dynamic:B,T") batching replace step 3's trigger: a batch of up
// to B waiting requests is formed only when the previous batch has completely finished (static: at
// once; dynamic: once B are waiting or the oldest has waited T ms), and only members of the current
// batch are admitted. They exist to be compared against continuous batching.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_manager.h"
#include "sched/request.h"

namespace pagellm {

enum class BatchingMode { kContinuous, kStatic, kDynamic };

struct BatchingPolicy {
  BatchingMode mode = BatchingMode::kContinuous;
  int32_t batch_size = 0;    // B: static and dynamic
  double max_wait_ms = 0.0;  // T: dynamic
  std::string to_string() const;  // "continuous", "static:8", "dynamic:8,50"
};
// "continuous" | "static:B" | "dynamic:B,T" (B >= 1 requests, T >= 0 milliseconds).
Result<BatchingPolicy> parse_batching_policy(std::string_view text);

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 8192;  // tokens per step (decodes + prefill chunks)
  int32_t max_num_seqs = 256;             // running sequences (n > 1 requests count n)
  int32_t max_waiting = 1024;             // waiting-queue bound; add_request beyond it: 429
  double watermark = 0.01;                // fraction of blocks admission keeps free, in [0, 1)
  BatchingPolicy batching;
  bool paranoid = kKvParanoidDefault;     // check_invariants() after every call (CHECK-fails)
};

// One sequence's work in a step.
struct ScheduledSeq {
  RequestId request_id = 0;
  int32_t seq_index = 0;
  bool is_prefill = false;             // a prompt chunk (or recompute); false: a decode token
  // [n_q] tokens whose KV this step computes, at positions context_len - n_q + i, each into
  // KV slot block_table[p / block_size] * block_size + p % block_size of its position p.
  std::vector<int32_t> token_ids;
  std::vector<BlockId> block_table;    // the sequence's whole table after this step's allocation
  int32_t context_len = 0;             // tokens with KV once this step ran (seq_lens_kv)
  bool needs_logits = false;           // the chunk ends at the last known token
  int32_t n_samples = 0;               // tokens to sample from those logits (0 without logits)
  // Speculative decoding: the last n_draft of token_ids are guesses (Scheduler::set_draft) that
  // this step verifies, so the step wants the logits of every token of the chunk (1 + n_draft
  // rows), and its KV is written for them all, provisionally.
  int32_t n_draft = 0;
  std::vector<BlockCopy> copies;       // copy-on-write ops for this sequence (also in plan.copies)
};

// A request that left the scheduler: finished, aborted or failed.
struct FinishedRequest {
  RequestId id = 0;
  RequestState state = RequestState::kFinished;  // kFinished or kAborted
  std::vector<FinishReason> reasons;             // per sequence
  std::string error;                             // set when the scheduler failed it
  int32_t prompt_len = 0;
  int32_t n_output_tokens = 0;                   // over all sequences
  int32_t n_cached_tokens = 0;
  int32_t n_preemptions = 0;
};

struct SchedulePlan {
  std::vector<ScheduledSeq> seqs;         // decodes first, then prefill chunks (oldest first)
  std::vector<BlockCopy> copies;          // all copy-on-write ops; run before the forward
  std::vector<RequestId> preempted;       // moved back to the waiting queue this step
  std::vector<FinishedRequest> failed;    // given up on this step (already removed)
  int32_t n_tokens = 0;                   // sum of token_ids sizes (<= max_num_batched_tokens)
  int32_t n_decode_seqs = 0;
  bool empty() const { return seqs.empty(); }
};

// A token sampled but not yet read: the engine queues the next step before the host sees the
// tokens of the one in flight (Scheduler::can_plan_ahead), reports them as kPendingToken to
// on_step_done(), and their values with resolve_tokens() once they arrive.
inline constexpr int32_t kPendingToken = -1;

// One sampled token, as the engine reports it.
struct SampledToken {
  RequestId request_id = 0;
  int32_t seq_index = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::kNone;  // the engine's stop decision for this sequence
};

struct SchedulerStats {
  int32_t n_waiting = 0;        // including preempted requests (vllm:num_requests_waiting)
  int32_t n_running = 0;        // requests (vllm:num_requests_running)
  int32_t n_running_seqs = 0;
  int64_t n_preemptions = 0;    // total (vllm:num_preemptions)
  double kv_usage = 0.0;        // vllm:kv_cache_usage_perc
  PrefixCacheStats prefix;      // vllm:prefix_cache_queries / _hits
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerConfig& config,
                                                   const KvCacheConfig& kv_config);

  // Queues a request (state kWaiting). Errors, nothing queued: kInvalidArgument for an empty
  // prompt, max_tokens or n < 1, n > max_num_seqs, a duplicate id, or a worst case (prompt +
  // max_tokens for n samples) larger than the whole KV pool; kResourceExhausted when the waiting
  // queue holds max_waiting requests.
  Status add_request(RequestSpec spec);
  // Aborts a live request wherever it is and frees its blocks now. Returns false for an unknown id
  // (finished or never added). Safe while a step is in flight: that step's results for it are
  // ignored. *info (optional) receives its summary.
  bool abort(RequestId id, FinishedRequest* info = nullptr);

  // Plans the next step. `now_ms` is the engine clock (used by dynamic batching). When the plan
  // is non-empty a step is in flight until on_step_done(); calling schedule() again before that is
  // a programmer error. The plan copies everything it needs (valid after later calls).
  SchedulePlan schedule(double now_ms = 0.0);
  // Optional: hands a plan the caller is done with back, so the next ones reuse its buffers (a
  // sequence's tokens and block table each step had been a few allocations a sequence).
  void recycle(SchedulePlan&& plan);
  // Reports the step's sampled tokens: for every scheduled sequence with needs_logits,
  // n_samples tokens (seq_index 0..n_samples-1 for a first sample of n > 1, else the sequence's
  // own index); a sequence that verified a draft reports 1 to n_draft + 1 tokens, in order, all
  // but the last being its first guesses (fewer when the engine stopped it). Appends them,
  // registers the newly full blocks in the prefix cache, finishes sequences the engine stopped or
  // that hit max_tokens, frees their blocks, and returns the requests that completed (they are
  // forgotten). Results for aborted requests are ignored.
  std::vector<FinishedRequest> on_step_done(std::span<const SampledToken> results);

  // Speculative decoding: `draft` guesses the tokens after sequence seq_index's last one, for the
  // next schedule() only (a decode then verifies up to draft.size() of them, as budget, blocks
  // and max_tokens allow). Ignored unless the sequence is running and its next step a decode.
  void set_draft(RequestId id, int32_t seq_index, std::span<const int32_t> draft);

  // Planning ahead. True when on_step_done() may take the step in flight's tokens as
  // kPendingToken: every running sequence is in that step, wants its logits, and will be a plain
  // decode next (no prompt chunk left, no unforked n > 1 request, none parked), and the blocks
  // their next tokens need are free now, so the next schedule() preempts nothing and plans
  // kPendingToken only as a decode's input. Sequences that reach max_tokens still finish in
  // on_step_done(). Until resolve_tokens(), a pending token is known only as a count.
  bool can_plan_ahead() const;
  // The values of the last on_step_done()'s pending tokens, with the engine's stop decisions
  // (finish set: the sequence ends now, its blocks freed; a step already planned for it is
  // ignored when it is reported). Results for sequences or requests that ended meanwhile are
  // ignored. Must come before the next on_step_done(), whose step's KV those tokens are.
  // Returns the requests that completed.
  std::vector<FinishedRequest> resolve_tokens(std::span<const SampledToken> results);

  const Request* find(RequestId id) const;
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_running_seqs() const { return running_seqs_; }
  // Whether sequence seq_index of request id is running and its next step is a decode (of its
  // last token): the sequences set_draft() serves.
  bool next_is_decode(RequestId id, int32_t seq_index) const;
  bool has_unfinished() const { return !requests_.empty(); }
  bool step_in_flight() const { return !in_flight_.empty(); }
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return mgr_; }

  // Every invariant: the block manager's, each block's refcount equals the number of tables
  // holding it, waiting requests hold no blocks, each running sequence's table covers exactly its
  // computed tokens, sequence counts, and FCFS order (running and waiting sorted by arrival, every
  // running request older than every waiting one). O(n_blocks + table entries).
  Status check_invariants() const;

 private:
  struct InFlight {
    RequestId id;
    int32_t seq_index;
    bool needs_logits;
    int32_t n_samples;
    int32_t n_draft;
  };
  struct Entry {
    Request* req;
    ScheduledSeq seq;
  };

  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config);

  bool is_decode(const Request& r, const Sequence& s) const;
  // Schedules up to `want` tokens of running sequence s, preempting newer requests for blocks.
  // False if r itself was preempted or failed (and so removed from running_).
  bool schedule_running(Request* r, Sequence& s, int32_t want);
  bool try_admit(Request* r);
  void emit(Request* r, Sequence& s, int32_t n_tokens, bool is_prefill);
  // Extends the planned decodes with their drafts, within the budget and the free blocks left.
  void add_drafts();
  void preempt(Request* r);
  void fail(Request* r, std::string reason);
  // What abort() and fail() share: r leaves the running or waiting queue with its blocks freed,
  // and it and every unfinished sequence of it end as aborted (the caller reports and forgets it).
  void end_aborted(Request* r);
  void drop_entries(const Request* r);
  void maybe_form_batch(double now_ms);
  void maybe_unpark(Request* r, int32_t leader_committed);
  void release_all(Request* r);
  void remove_running(const Request* r);
  FinishedRequest summarize(const Request& r) const;
  void forget(Request* r);
  // Ends running sequence s with `reason`: its blocks freed, no longer counted as running.
  void end_sequence(Sequence& s, FinishReason reason);
  // Running request r, whose sequences have all ended, leaves as finished: out of running_,
  // forgotten; returns its summary.
  FinishedRequest complete(Request* r);
  void maybe_check() const;

  SchedulerConfig config_;
  BlockManager mgr_;
  int32_t watermark_blocks_ = 0;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;   // arrival order (preempted requests re-inserted in place)
  std::vector<Request*> running_;  // arrival order (see check_invariants)
  int32_t running_seqs_ = 0;       // sum of n_live() over running_
  uint64_t next_arrival_ = 0;
  int64_t n_preemptions_ = 0;
  // batching modes
  uint64_t current_batch_ = 0;
  int32_t batch_open_ = 0;         // members of the current batch not yet finished
  // the step being planned / in flight
  std::vector<Entry> entries_;
  int32_t budget_ = 0;
  SchedulePlan* plan_ = nullptr;
  std::vector<InFlight> in_flight_;
  bool drafts_given_ = false;  // set_draft() was called since the last schedule()
  std::vector<uint32_t> by_sequence_;  // on_step_done's lookup order, kept for its capacity
  // What recycle() kept: an emptied plan and its sequences' storage (overwritten by emit()).
  SchedulePlan spare_plan_;
  std::vector<ScheduledSeq> spare_seqs_;
};

}  // namespace pagellm
