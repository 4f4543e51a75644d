// Engine: the serving loop. Callers on any thread submit requests and receive a stream of outputs;
// one engine thread steps while any request is live: the scheduler (sched/) plans a step, the
// StepBatchBuilder packs it, the model runs it over the paged KV cache, the sampler picks tokens,
// the detokenizer and stop checker turn them into text deltas and finish decisions, and the
// scheduler is told what happened. Aborts take effect at the top of the next step, which frees
// the request's KV blocks before anything else runs. On a device that samples, a step's tokens
// usually stay there while the next step is planned and queued (EngineConfig::plan_ahead): the
// host reads them, and sends their events, once the device has the next step to run.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/finish_reason.h"
#include "core/status.h"
#include "model/logits_head.h"
#include "model/model.h"
#include "runtime/decode_graphs.h"
#include "runtime/grammar.h"
#include "runtime/step_batch.h"
#include "sample/logprobs.h"
#include "sample/sample_batch.h"
#include "sample/sampler.h"
#include "sample/sampling_params.h"
#include "sched/scheduler.h"
#include "spec/ngram_proposer.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

// Speculative decoding: a proposer guesses up to num_tokens tokens after a decoding sequence's
// last one, and the step verifies them all in one pass (the sequence's next token and one more
// per guess). Each position's token is sampled exactly as decoding without speculation would
// sample it (same seed, same step, same processors, the guesses before it as its history), and
// a guess counts only where it equals that token: outputs are identical to decoding without
// speculation, greedy or sampled, token for token.
struct SpeculativeConfig {
  // kNgram: prompt lookup (spec/ngram_proposer.h); kDraftModel: draft_model decodes ahead
  // (runtime/draft_model_proposer.h); kMtp: the target's multi-token-prediction module guesses
  // from its hidden states (runtime/mtp_proposer.h).
  enum class Method { kNone, kNgram, kDraftModel, kMtp };
  Method method = Method::kNone;
  Model* draft_model = nullptr;  // kDraftModel: loaded by the caller on the engine's backend
  MtpModule* mtp = nullptr;      // kMtp: loaded by the caller beside the model
  int32_t num_tokens = 4;  // guesses per step, at most
  NgramConfig ngram;
  // Off while this many sequences or more are running (0: never off). A step that verifies a
  // guess runs eager, outside the decode graphs, for its whole batch: on an H100 (Llama-3-8B
  // shape, prompt lookup at 20-40% acceptance) speculation was 7% faster than none at batch 1
  // and 5-7% slower at batches 2, 4 and 8 (docs/perf-history/speculative.md), hence 2.
  int32_t disable_by_batch_size = 2;
};

struct EngineConfig {
  SchedulerConfig scheduler;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
  // KV pool size: explicit bytes, or this fraction of the backend's free memory after the weights
  // and, on a device, after the profile run has grown scratch to its largest step.
  int64_t kv_cache_memory = 0;
  double memory_utilization = 0.9;
  // The KV cache's element type: false, the activation dtype (f32 on the CPU, bf16 on devices);
  // true, float8_e4m3fn with the checkpoint's per-layer scales or 1 (--kv-cache-dtype fp8): a
  // byte a value, so 2x (4x on the CPU) the tokens in the same memory, rounded to 3 mantissa bits.
  bool fp8_kv_cache = false;
  // Longest prompt + output a request may have (0: the model's max_position_embeddings).
  int32_t max_model_len = 0;
  // Run every step op by op: no recorded decode graphs (runtime/decode_graphs.h) and no start-up
  // warm-up. For debugging and for comparing against the graph path.
  bool enforce_eager = false;
  // Sample on the host (download the logits, CPU Sampler) even when the backend can sample on its
  // device. The tokens are the same either way; for comparison and debugging.
  bool host_sampling = false;
  // Plan and queue each decode step before the host has read the tokens of the one in flight
  // (they go from the sampler to the next step on the device), where sampling reads no earlier
  // token values (no penalties). Off: every step waits for its tokens, for comparison.
  bool plan_ahead = true;
  SpeculativeConfig speculative;
};

struct EngineRequest {
  std::vector<int32_t> prompt;  // token ids
  SamplingParams params;        // validated by submit()
  bool detokenize = true;       // produce text deltas (needs a tokenizer)
  bool skip_special_tokens = true;
  std::vector<uint64_t> extra_keys;  // prefix-cache salt (LoRA id, cache_salt)
  // Structured output: the grammar every sequence's text must follow (GrammarCompiler::compile
  // of this engine's grammars()); null: none. Each step its sequences are sampled with the
  // grammar's mask (made on the host while the device runs the forward), and they end when the
  // grammar does.
  std::shared_ptr<const CompiledGrammar> grammar;
  // A reasoning model's thought is not bound by the grammar, only the answer after it: with
  // think_end set, a sequence's grammar starts after that token. think_open: the thought is open
  // from the first token (DeepSeek-R1's template opens it in the prompt); else the sequence may
  // open one with think_start as its first token (Qwen3), or answer at once.
  struct Thinking {
    int32_t think_start = -1;
    int32_t think_end = -1;
    bool think_open = false;
  };
  std::optional<Thinking> thinking;
};

// One event on a request's stream. For n > 1, each sequence streams its own events.
struct EngineOutput {
  uint64_t request_id = 0;
  int32_t seq_index = 0;
  std::vector<int32_t> token_ids;        // new tokens in this event
  std::string text;                      // their text delta (stop strings held back / removed)
  std::vector<LogprobsResult> logprobs;  // per new token, when params.logprobs is set
  // Sent once, on the first event of sequence 0, when params.prompt_logprobs is set:
  // entry i is for prompt[i + 1].
  std::vector<LogprobsResult> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;  // set on this sequence's last event
  std::optional<int32_t> stop_token;          // what matched, when finish == kStop
  std::optional<std::string> stop_string;
  bool request_done = false;  // the last event of the whole request (all sequences finished)
  Status error;               // the request failed (then finish == kAbort, request_done)
  // Usage, filled on the request_done event.
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  // When the engine first scheduled the request (its first prefill chunk ran), filled on the
  // request_done event; the default (epoch) value when it never ran. Servers derive queue time
  // (arrival -> scheduled) and prefill time (scheduled -> first token) from it.
  std::chrono::steady_clock::time_point scheduled_time{};
  // When the scheduler preempted the request (freed its KV blocks, to recompute them later), one
  // entry per preemption, filled on the request_done event (the server's trace spans show them).
  std::vector<std::chrono::steady_clock::time_point> preemption_times;
};

using OutputCallback = std::function<void(EngineOutput&&)>;

struct EngineStats {
  SchedulerStats scheduler;
  int64_t n_kv_blocks = 0;
  int32_t kv_block_size = 0;  // tokens a block
  int64_t kv_block_bytes = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t steps = 0;
  // Steps whose tokens stayed on the device while the next step was planned and queued
  // (EngineConfig::plan_ahead).
  int64_t steps_planned_ahead = 0;
  double busy_seconds = 0;  // time spent inside steps
  // Structured outputs: steps with grammar rows, and the host time making their token masks.
  int64_t grammar_mask_steps = 0;
  double grammar_mask_seconds = 0;
  // Speculative decoding (vllm:spec_decode_*): drafts verified (one per sequence and step), the
  // guesses they held, the guesses that were right, and those by position in their draft.
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;  // empty without a proposer
  double spec_draft_seconds = 0;                    // the proposer's time
  // Of that, the host's own work with nothing queued on the device: scheduling and packing a step
  // before its forward is queued, and handling its sampled tokens once they are back (text,
  // stop checks, events). On a device backend the device idles meanwhile, so this is the share
  // of a step that overlapping host and device work could win back.
  double host_seconds = 0;
  // Tokens computed per step (prefill chunks + decodes), as a histogram with upper bounds
  // kIterationTokenBuckets (counts per bucket, not cumulative; the last entry counts larger steps):
  // vllm:iteration_tokens_total.
  static constexpr std::array<int32_t, 13> kIterationTokenBuckets = {
      1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  std::array<int64_t, kIterationTokenBuckets.size() + 1> iteration_tokens{};
  int64_t iteration_tokens_sum = 0;
};

class Engine {
 public:
  // `tokenizer` may be null (token ids only; requests asking for text then fail).
  static Result<std::unique_ptr<Engine>> create(Model& model, Backend& backend,
                                                const Tokenizer* tokenizer,
                                                const EngineConfig& config);
  ~Engine();

  // Validates and queues a request; `on_output` is called on the engine thread for every event
  // (it must be quick and must not call back into the engine). Errors (nothing queued):
  // kInvalidArgument for bad parameters or a prompt that does not fit max_model_len,
  // kResourceExhausted when the waiting queue is full.
  Result<uint64_t> submit(EngineRequest request, OutputCallback on_output);
  // Aborts a request (no-op for unknown or finished ones); its stream ends with finish kAbort.
  void abort(uint64_t request_id);

  // Stops the engine thread after aborting everything still live.
  void shutdown();

  EngineStats stats() const;
  int32_t max_model_len() const { return max_model_len_; }
  const ModelConfig& model_config() const { return model_.config(); }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  // Compiles the grammars of structured-output requests (EngineRequest::grammar) for this model's
  // vocabulary; null when the engine has no tokenizer. Thread-safe.
  GrammarCompiler* grammars() const { return grammars_.get(); }
  bool idle() const;

 private:
  struct Live;
  Engine(Model& model, Backend& backend, const Tokenizer* tokenizer, const EngineConfig& config);
  Status init();
  // Device backends: one step of the largest size before the KV pool is sized (see engine.cpp).
  void profile_run();
  // Runs the device's sampling kernels once on `logits` ([rows, vocab] on the device), so their
  // first launch is not a request's.
  void warm_up_sampling(const Tensor& logits);
  // A sampled row's sequence. `live` stays valid while a step refers to it (retired_).
  struct Pick {
    Live* live;
    int32_t seq_index;
    // A verified draft's rows: this row's position in it (0: the row of the sequence's last
    // token), and the guess the next row assumed this row's token to be (-1: the last row).
    // -1, -1: a plain row.
    int32_t draft_pos = -1;
    int32_t guess = -1;
    int32_t n_draft = 0;  // the draft's guesses
  };
  // One step's forward: a recorded decode graph when it fits, else op by op. Returns the logits
  // on the device ([n_logits, vocab]; undefined when the step wants none). With a sampling
  // ticket, negative token ids are that call's tokens (Backend::take_sampled_tokens).
  Tensor run_model(const std::vector<SeqChunk>& chunks, uint64_t sampled_ticket = 0);
  void loop();
  void step();
  // Samples rows[k] from logits row sample_rows[k]: on the device from `logits` (the step's
  // device logits) when on_device, else on the host from logits_.
  void sample(const Tensor& logits, bool on_device, const std::vector<SampleRow>& rows,
              const std::vector<int64_t>& sample_rows, std::vector<SampleOutput>& outs);
  SamplerConfig sampler_config() const;
  // Device sampling in two halves: queue it (rows packed into packed_), then read the results.
  uint64_t sample_on_device(const Tensor& logits, const std::vector<SampleRow>& rows,
                            const std::vector<int64_t>& sample_rows);
  void read_device_samples(uint64_t ticket, const PackedSampleBatch& packed,
                           std::vector<SampleOutput>& outs);
  // Whether sampling with `p` reads the values of the tokens generated before (the penalties),
  // which a step planned ahead does not know yet.
  static bool uses_output_values(const SamplingParams& p);
  // A step's picks of one sequence: a plain pick, or a verified draft's rows (picks with
  // draft_pos 0, 1, ...), which follow one another.
  struct SeqPicks {
    size_t first_pick;
    int32_t n_rows;
  };
  static std::vector<SeqPicks> group_by_sequence(const std::vector<Pick>& picks);
  // The allowed-token masks of the step's constrained picks into grammar_masks_ (pick k's at
  // grammar_mask_of_[k], -1: none), made while the device runs the step's forward.
  void fill_grammar_masks(const std::vector<Pick>& picks);
  // What a grammar made of a pick's sampled token: emit_tokens' decisions for constrained picks.
  struct GrammarTake {
    bool taken = false;       // the pick's token went to its sequence's grammar (or thought)
    bool refused = false;     // the grammar did not allow it (a bug upstream: logged)
    bool terminated = false;  // the grammar ended with it
  };
  // The grammars take the sampled tokens of picks (outs[k] is picks[k]'s) into grammar_takes_,
  // in parallel across sequences: emit_tokens' skips, one sequence's picks in order.
  void advance_grammars(const std::vector<Pick>& picks, const std::vector<SampleOutput>& outs);
  // The sampled tokens of picks (outs[k] is picks[k]'s) as text, stop decisions and events;
  // appended to each sequence's outputs, or, resolving, in place of its pending token. Picks of
  // requests gone or sequences stopped meanwhile are skipped; rows that failed go to `failed`.
  // Returns the tokens appended.
  int64_t emit_tokens(const std::vector<Pick>& picks, std::vector<SampleOutput>& outs,
                      bool resolving, std::vector<SampledToken>& results,
                      std::vector<uint64_t>& failed);
  // Speculative decoding: the rejection sampler's verdict on the verified drafts whose guesses
  // were drawn from a draft's distribution (Live::Seq::draft_probs), in place of the plain draws
  // sample() made for their rows (host sampling: logits_ holds the rows).
  void verify_drawn_drafts(const std::vector<Pick>& picks, const std::vector<SampleRow>& rows,
                           const std::vector<int64_t>& sample_rows,
                           std::vector<SampleOutput>& outs);
  // Reads the pending step's tokens (emit_tokens, Scheduler::resolve_tokens) and ends the
  // requests it completed.
  void read_pending();
  // Speculative decoding: gives the scheduler the proposer's drafts for the sequences that
  // decode next (before schedule()).
  void propose_drafts();
  // Slots of a proposer's own cache (a draft model's, an MTP module's): one for each sequence
  // that may be drafted for at once.
  int32_t speculation_slots() const;
  // Hands a proposer that reads hidden rows (Proposer::reads_hidden) the step's chunks and the
  // target's hidden rows, before the next forward overwrites them.
  void observe_target(const SchedulePlan& plan, const std::vector<SeqChunk>& chunks);
  // Ends requests whose sampling failed (non-finite logits).
  void fail_sampling(const std::vector<uint64_t>& failed);
  void drain_inbox();
  void finish_request(Live& live, const FinishedRequest& info);
  // finish_request for each request the scheduler reports finished that is still live.
  void finish_requests(const std::vector<FinishedRequest>& finished);
  void publish_stats();
  void emit_error(uint64_t id, OutputCallback& cb, const Status& s);

  Model& model_;
  Backend& backend_;
  const Tokenizer* tokenizer_;
  EngineConfig config_;
  int32_t max_model_len_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  KvCache cache_;
  int64_t kv_block_bytes_ = 0;

  struct Inbox {
    uint64_t id;
    EngineRequest request;
    OutputCallback callback;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Inbox> inbox_;
  std::vector<uint64_t> aborts_;
  bool stop_ = false;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> n_pending_{0};  // submitted and not yet done
  EngineStats stats_;                  // guarded by mu_ for readers

  // Engine thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Live>> live_;
  // Finished requests a step's picks may still point at: those finished since the step before
  // began, and those finished during it (a pending step's picks are read one step later).
  std::vector<std::unique_ptr<Live>> retired_, retired_before_;
  std::unique_ptr<StepBatchBuilder> builder_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: eager steps only (CPU, --enforce-eager)
  LogitsDownload download_{backend_};     // logits bound for the host sampler
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<GrammarCompiler> grammars_;
  std::vector<uint32_t> grammar_masks_;        // this step's grammar rows' allowed-token bitmasks
  std::vector<int64_t> grammar_mask_of_;  // per pick: its mask's offset in grammar_masks_, or -1
  std::vector<GrammarTake> grammar_takes_;  // per pick of the tokens being emitted
  std::unique_ptr<Proposer> proposer_;    // null: no speculative decoding
  bool spec_active_ = false;              // this step speculates: it is not planned ahead of
  std::vector<ProposalRequest> proposals_;  // propose_drafts()'s, reused
  std::vector<TargetChunk> observed_;       // observe_target()'s, reused
  std::vector<std::vector<int32_t>> spec_tokens_, spec_drafts_;
  std::vector<std::vector<int32_t>> spec_histories_;  // a step's verified drafts: outputs + guesses
  std::unique_ptr<SampleBatchPacker> packer_;  // device sampling: the rows as plain data
  PackedSampleBatch packed_;
  // A step whose tokens are still on the device: the step after it was planned and queued
  // before the host read them (Scheduler::can_plan_ahead). ticket 0: none.
  struct PendingStep {
    uint64_t ticket = 0;
    std::vector<Pick> picks;                // result row k is picks[k]'s token
    PackedSampleBatch packed;               // what unpacking its results needs
    std::vector<FinishedRequest> finished;  // completed at max_tokens when it was planned
  };
  PendingStep pending_;
  std::vector<DeviceSampleResult> device_results_;
  std::vector<float> logits_;         // [n_logits, vocab] of the step
  std::vector<float> sample_logits_;  // [n_samples, vocab]: the rows being sampled
  std::thread thread_;
};

}  // namespace pagellm
