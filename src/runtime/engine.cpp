#include "runtime/engine.h"

#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "core/thread_pool.h"
#include "runtime/draft_model_proposer.h"
#include "runtime/mtp_proposer.h"
#include "runtime/step_batch.h"
#include "sample/logits_processors.h"
#include "sample/rejection_sampler.h"
#include "sample/sample_rng.h"
#include "sample/sampler.h"
#include "sample/stop_checker.h"
#include "tokenizer/detokenizer.h"

namespace pagellm {
namespace {

using Clock = std::chrono::steady_clock;

double now_ms() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

// On the CPU the KV pool needs no profile run: weights are mapped, not copied. Cap the default so
// a laptop does not reserve most of its memory for cache it will never fill.
constexpr int64_t kCpuDefaultKvBytes = int64_t{2} << 30;

// The longest pause in drafting for a sequence whose guesses keep failing (steps).
constexpr int32_t kMaxSpecBackoff = 16;
// A sequence's share of right guesses, averaged over its drafts (each draft weighs kSpecRateWeight
// against the ones before): below kMinSpecRate its drafts cost more than they return. At 17.8%
// (the Llama-3-8B shape's random weights at batch 8 on an H100) speculation was 5.6% slower than
// none, at 36.5% (batch 1) 7.5% faster: docs/perf-history/speculative.md.
constexpr float kSpecRateWeight = 0.3f;
constexpr float kMinSpecRate = 0.25f;

}  // namespace

// A request the engine thread is working on.
struct Engine::Live {
  uint64_t id = 0;
  EngineRequest req;
  OutputCallback cb;
  struct Seq {
    uint64_t seed = 0;
    std::vector<int32_t> outputs;
    std::unique_ptr<IncrementalDetokenizer> detok;
    std::unique_ptr<StopChecker> stop;
    std::unique_ptr<GrammarMatcher> grammar;  // structured output: where its text is
    // Whether the grammar binds the next token: not inside a reasoning model's thought.
    enum class Phase { kAnswer, kMayThink, kThinking } phase = Phase::kAnswer;
    int32_t pending_row = -1;  // its last token's row in the pending step's results, if any
    // Speculative decoding: steps left before a draft is made for it again, and how many steps a
    // draft with no right guess, or a share of right guesses below kMinSpecRate, costs it next
    // (doubling up to kMaxSpecBackoff; 0 after a draft that paid).
    int32_t spec_skip = 0;
    int32_t spec_backoff = 0;
    float spec_rate = 1.0f;  // the share of its guesses found right, averaged over its drafts
    // The distributions its last proposal drew its guesses from (a sampled request's, from a
    // draft model), one per guess; empty: deterministic guesses, verified exactly.
    std::vector<std::vector<TokenProb>> draft_probs;
  };
  std::vector<Seq> seqs;
  std::vector<LogprobsResult> prompt_logprobs;  // accumulated over prefill chunks
  bool prompt_logprobs_sent = false;
  Clock::time_point scheduled_time{};  // first step that ran it (EngineOutput::scheduled_time)
  std::vector<Clock::time_point> preemption_times;  // EngineOutput::preemption_times
  bool done = false;  // finish_request() ran: only retired_ still holds it
};

Engine::Engine(Model& model, Backend& backend, const Tokenizer* tokenizer,
               const EngineConfig& config)
    : model_(model), backend_(backend), tokenizer_(tokenizer), config_(config) {}

Result<std::unique_ptr<Engine>> Engine::create(Model& model, Backend& backend,
                                               const Tokenizer* tokenizer,
                                               const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine(model, backend, tokenizer, config));
  PAGELLM_RETURN_IF_ERROR(e->init());
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

Engine::~Engine() {
  shutdown();
}

Status Engine::init() {
  const ModelConfig& mc = model_.config();
  max_model_len_ = config_.max_model_len > 0 ? config_.max_model_len
                                             : static_cast<int32_t>(mc.max_position_embeddings);
  if (max_model_len_ <= 0) return invalid_argument("max_model_len must be positive");
  if (mc.max_position_embeddings > 0 && max_model_len_ > mc.max_position_embeddings) {
    return invalid_argument("--max-model-len " + std::to_string(max_model_len_) +
                            " exceeds the model's max_position_embeddings " +
                            std::to_string(mc.max_position_embeddings));
  }
  if (tokenizer_) {
    PAGELLM_ASSIGN_OR_RETURN(
        grammars_, GrammarCompiler::create(*tokenizer_, static_cast<int32_t>(mc.vocab_size),
                                           mc.eos_token_ids));
  }
  const SpeculativeConfig& sc = config_.speculative;
  if (sc.method != SpeculativeConfig::Method::kNone) {
    if (sc.num_tokens < 1) return invalid_argument("--num-speculative-tokens must be >= 1");
    if (sc.ngram.min_n < 1 || sc.ngram.max_n < sc.ngram.min_n)
      return invalid_argument("--prompt-lookup-min must be >= 1 and <= --prompt-lookup-max");
    if (sc.method == SpeculativeConfig::Method::kNgram) {
      proposer_ = std::make_unique<NgramProposer>(sc.ngram);
    } else if (sc.method == SpeculativeConfig::Method::kMtp) {
      if (!sc.mtp) return invalid_argument("--speculative-method mtp: no MTP module loaded");
      proposer_ = std::make_unique<MtpProposer>(
          *sc.mtp, backend_, max_model_len_, speculation_slots(), sc.num_tokens, sampler_config());
    } else {
      if (!sc.draft_model) return invalid_argument("speculative decoding: no draft model given");
      const int64_t v = sc.draft_model->config().vocab_size;
      if (v != mc.vocab_size)
        return invalid_argument("--speculative-model: the draft model's vocabulary (" +
                                std::to_string(v) + " tokens) is not the model's (" +
                                std::to_string(mc.vocab_size) +
                                "): draft and target must share one tokenizer");
      proposer_ = std::make_unique<DraftModelProposer>(*sc.draft_model, backend_, max_model_len_,
                                                       speculation_slots(), sampler_config(),
                                                       !config_.enforce_eager);
    }
    stats_.spec_accepted_per_position.assign(static_cast<size_t>(sc.num_tokens), 0);
  }
  const KvSpec spec = model_.kv_spec();
  const int32_t bs = config_.block_size;
  if (bs < 1) return invalid_argument("--block-size must be >= 1");
  if (config_.fp8_kv_cache && !backend_.supports_fp8_kv_cache())
    return unimplemented("--kv-cache-dtype fp8: the " + backend_.name() +
                         " backend does not read an FP8 KV cache yet (the CPU backend does)");
  const DType kv_dtype = config_.fp8_kv_cache ? DType::kF8E4M3 : backend_.activation_dtype();
  kv_block_bytes_ = KvCache::bytes_per_block(spec, bs, kv_dtype);
  // On a device, the largest step runs first (profile_run), so the pool below is sized from the
  // memory left after the weights AND that step's scratch and workspaces.
  if (backend_.device() != Device::kCpu) profile_run();
  int64_t budget = config_.kv_cache_memory;
  if (budget <= 0) {
    budget = static_cast<int64_t>(backend_.free_memory() * config_.memory_utilization);
    if (backend_.device() == Device::kCpu) budget = std::min(budget, kCpuDefaultKvBytes);
  }
  const int64_t n_blocks = budget / kv_block_bytes_;
  const int64_t need = (max_model_len_ + bs - 1) / bs;
  if (n_blocks < need) {
    return resource_exhausted("a KV cache of " + std::to_string(budget >> 20) + " MiB holds " +
                              std::to_string(n_blocks * bs) + " tokens, less than one " +
                              std::to_string(max_model_len_) +
                              "-token sequence: raise --kv-cache-memory or lower --max-model-len");
  }
  cache_ = KvCache::allocate(backend_, spec, bs, n_blocks, kv_dtype);
  // An FP8 cache's per-layer scales: the checkpoint's, else 1 (as vLLM's default: keys and
  // values past 448 saturate).
  for (const auto& [k_scale, v_scale] :
       config_.fp8_kv_cache ? model_.kv_cache_scales() : std::vector<std::pair<float, float>>{}) {
    cache_.k_scales.push_back(k_scale);
    cache_.v_scales.push_back(v_scale);
  }
  KvCacheConfig kv;
  kv.n_blocks = static_cast<int32_t>(std::min<int64_t>(n_blocks, INT32_MAX));
  kv.block_size = bs;
  kv.enable_prefix_caching = config_.enable_prefix_caching;
  PAGELLM_ASSIGN_OR_RETURN(scheduler_, Scheduler::create(config_.scheduler, kv));
  if (!config_.enforce_eager) {
    graphs_ = DecodeGraphs::create(model_, backend_, cache_, bs, config_.scheduler.max_num_seqs,
                                   max_model_len_);
    if (graphs_) {
      const auto t0 = Clock::now();
      graphs_->warm_up();
      PAGELLM_LOG_INFO(
          "recorded %zu decode graphs (batch 1..%d, %zu context tiers up to %d) in "
          "%.2f s",
          graphs_->buckets().size() * graphs_->tiers().size(), graphs_->buckets().back(),
          graphs_->tiers().size(), graphs_->tiers().back(),
          std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  stats_.n_kv_blocks = n_blocks;
  stats_.kv_block_size = bs;
  stats_.kv_block_bytes = kv_block_bytes_;
  PAGELLM_LOG_INFO(
      "KV cache: %lld blocks of %d tokens (%.1f MiB, %lld tokens, %s, %lld bytes a token), "
      "max_model_len %d",
      static_cast<long long>(n_blocks), bs, n_blocks * kv_block_bytes_ / 1048576.0,
      static_cast<long long>(n_blocks * bs), std::string(dtype_name(kv_dtype)).c_str(),
      static_cast<long long>(kv_block_bytes_ / bs), max_model_len_);
  return {};
}

Result<uint64_t> Engine::submit(EngineRequest request, OutputCallback on_output) {
  const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
  SamplingParams& p = request.params;
  if (request.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= vocab)
      return invalid_argument("prompt token id " + std::to_string(t) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  const int32_t n_prompt = static_cast<int32_t>(request.prompt.size());
  if (n_prompt >= max_model_len_) {
    return invalid_argument("the prompt has " + std::to_string(n_prompt) +
                            " tokens, and this model's context is " +
                            std::to_string(max_model_len_) + " tokens");
  }
  if (!p.max_tokens) p.max_tokens = max_model_len_ - n_prompt;
  if (n_prompt + *p.max_tokens > max_model_len_) {
    return invalid_argument("the prompt has " + std::to_string(n_prompt) + " tokens and " +
                            std::to_string(*p.max_tokens) + " more were requested, but this " +
                            "model's context is " + std::to_string(max_model_len_) + " tokens");
  }
  PAGELLM_RETURN_IF_ERROR(p.validate(vocab));
  if (request.detokenize && !tokenizer_)
    return invalid_argument("this engine has no tokenizer, so it cannot produce text");
  if (!request.detokenize && !p.stop.empty())
    return invalid_argument("stop strings need detokenized output");
  if (const auto& t = request.thinking; t && (t->think_end < -1 || t->think_end >= vocab ||
                                              t->think_start < -1 || t->think_start >= vocab))
    return invalid_argument("a thinking marker token is outside the vocabulary");
  const uint64_t id = next_id_++;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Status(StatusCode::kAborted, "the engine is shutting down");
    inbox_.push_back({id, std::move(request), std::move(on_output)});
  }
  ++n_pending_;
  cv_.notify_one();
  return id;
}

void Engine::abort(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(request_id);
  }
  cv_.notify_one();
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool Engine::idle() const {
  return n_pending_.load() == 0;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::emit_error(uint64_t id, OutputCallback& cb, const Status& s) {
  EngineOutput o;
  o.request_id = id;
  o.finish = FinishReason::kAbort;
  o.request_done = true;
  o.error = s;
  --n_pending_;  // before the callback, so a caller woken by it sees the engine idle
  if (cb) cb(std::move(o));
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !inbox_.empty() || !aborts_.empty() || scheduler_->has_unfinished() ||
               pending_.ticket != 0;
      });
      if (stop_) {
        // Abort everything still live so every stream ends.
        for (auto& in : inbox_) aborts_.push_back(in.id);
      }
    }
    drain_inbox();
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stop_;
    }
    if (stopping) {
      if (pending_.ticket != 0) read_pending();  // its events, and the requests it completed
      std::vector<uint64_t> ids;
      for (auto& [id, l] : live_) ids.push_back(id);
      for (uint64_t id : ids) {
        FinishedRequest info;
        if (scheduler_->abort(id, &info)) finish_request(*live_.at(id), info);
      }
      return;
    }
    if (scheduler_->has_unfinished() || pending_.ticket != 0) step();
  }
}

void Engine::drain_inbox() {
  std::deque<Inbox> inbox;
  std::vector<uint64_t> aborts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    aborts.swap(aborts_);
  }
  for (Inbox& in : inbox) {
    if (std::find(aborts.begin(), aborts.end(), in.id) != aborts.end()) {
      emit_error(in.id, in.callback, Status(StatusCode::kAborted, "aborted before it started"));
      continue;
    }
    const SamplingParams& p = in.request.params;
    RequestSpec spec;
    spec.id = in.id;
    spec.prompt = in.request.prompt;
    spec.max_tokens = *p.max_tokens;
    spec.n = p.n;
    spec.extra_keys = in.request.extra_keys;
    // prompt_logprobs need every prompt position computed: a unique salt keeps this request off
    // the prefix cache.
    if (p.prompt_logprobs) spec.extra_keys.push_back(0x9e3779b97f4a7c15ull ^ in.id);
    spec.arrival_ms = now_ms();
    if (Status s = scheduler_->add_request(std::move(spec)); !s.ok()) {
      emit_error(in.id, in.callback, s);
      continue;
    }
    auto live = std::make_unique<Live>();
    live->id = in.id;
    live->req = std::move(in.request);
    live->cb = std::move(in.callback);
    const SamplingParams& lp = live->req.params;
    const uint64_t base_seed = lp.seed ? *lp.seed : draw_random_seed();
    const auto& eos = model_.config().eos_token_ids;
    live->seqs.resize(lp.n);
    for (int32_t i = 0; i < lp.n; ++i) {
      auto& s = live->seqs[i];
      s.seed = derive_sequence_seed(base_seed, static_cast<uint32_t>(i));
      if (live->req.detokenize)
        s.detok =
            std::make_unique<IncrementalDetokenizer>(*tokenizer_, live->req.skip_special_tokens);
      s.stop = std::make_unique<StopChecker>(lp, eos);
      if (live->req.grammar) {
        s.grammar = std::make_unique<GrammarMatcher>(live->req.grammar);
        if (const auto& t = live->req.thinking; t && t->think_end >= 0)
          s.phase = t->think_open         ? Live::Seq::Phase::kThinking
                    : t->think_start >= 0 ? Live::Seq::Phase::kMayThink
                                          : Live::Seq::Phase::kAnswer;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens_total += static_cast<int64_t>(live->req.prompt.size());
    }
    live_.emplace(in.id, std::move(live));
  }
  for (uint64_t id : aborts) {
    FinishedRequest info;
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    if (scheduler_->abort(id, &info)) finish_request(*it->second, info);
  }
}

void Engine::publish_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.scheduler = scheduler_->stats();
}

void Engine::finish_request(Live& live, const FinishedRequest& info) {
  // The scheduler has already released the request: publish that before the caller hears it is
  // done, so a caller that then reads stats() sees its blocks freed.
  publish_stats();
  if (proposer_) proposer_->release(live.id);
  // Sequences still open end now (abort or failure): flush what their stop checker held back.
  for (size_t i = 0; i < live.seqs.size(); ++i) {
    auto& s = live.seqs[i];
    if (s.stop->finished()) continue;
    EngineOutput o;
    o.request_id = live.id;
    o.seq_index = static_cast<int32_t>(i);
    o.text = s.stop->finish(FinishReason::kAbort);
    o.finish = FinishReason::kAbort;
    live.cb(std::move(o));
  }
  EngineOutput done;
  done.request_id = live.id;
  done.request_done = true;
  done.finish = info.state == RequestState::kAborted ? FinishReason::kAbort : FinishReason::kNone;
  if (!info.error.empty()) done.error = Status(StatusCode::kResourceExhausted, info.error);
  done.prompt_tokens = static_cast<int32_t>(live.req.prompt.size());
  // A token still pending (a request aborted while its step was planned ahead) was never sent.
  for (auto& s : live.seqs)
    done.completion_tokens += static_cast<int32_t>(
        s.outputs.size() - std::count(s.outputs.begin(), s.outputs.end(), kPendingToken));
  done.cached_tokens = info.n_cached_tokens;
  done.scheduled_time = live.scheduled_time;
  done.preemption_times = std::move(live.preemption_times);
  --n_pending_;  // before the callback, so a caller woken by it sees the engine idle
  live.cb(std::move(done));
  // A step's picks may still point at it (the step in flight, the pending one): kept, marked
  // done, until two steps have begun since.
  live.done = true;
  auto it = live_.find(live.id);
  retired_.push_back(std::move(it->second));
  live_.erase(it);
}

void Engine::finish_requests(const std::vector<FinishedRequest>& finished) {
  for (const FinishedRequest& f : finished) {
    auto it = live_.find(f.id);
    if (it != live_.end()) finish_request(*it->second, f);
  }
}

Tensor Engine::run_model(const std::vector<SeqChunk>& chunks, uint64_t sampled_ticket) {
  if (graphs_ && graphs_->accepts(chunks)) return graphs_->run(chunks, sampled_ticket);
  if (!builder_) builder_ = std::make_unique<StepBatchBuilder>(backend_, config_.block_size);
  const StepBatch& batch = builder_->build(chunks, sampled_ticket);
  model_.forward(batch, cache_, nullptr);
  return batch.n_logits > 0 ? model_.last_logits() : Tensor();
}

void Engine::profile_run() {
  // The largest prompt chunk a step can hold, run once op by op on a cache just big enough for
  // it: it grows the model's scratch and the backend's workspaces to their steady-state size, so
  // the KV pool is sized from what is really left, and recorded decode graphs are not invalidated
  // by the first long prompt.
  const auto t0 = Clock::now();
  const int32_t bs = config_.block_size;
  const int32_t n = std::min(config_.scheduler.max_num_batched_tokens, max_model_len_ - 1);
  if (n <= 0) return;
  std::vector<int32_t> tokens(n, 0), table((n + bs - 1) / bs);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  cache_ = KvCache::allocate(backend_, model_.kv_spec(), bs, static_cast<int64_t>(table.size()));
  SeqChunk c;
  c.tokens = tokens.data();
  c.n_tokens = n;
  c.block_table = table.data();
  c.n_blocks = static_cast<int32_t>(table.size());
  const Tensor logits = run_model({c});
  warm_up_sampling(logits);
  // Then steps of 1 to 8 tokens and of every power of two below n: a step size's first run
  // chooses its GEMM kernels (the GEMV or cuBLASLt, timed for 3 to 8 rows) and loads the kernels
  // that size runs, which left to the first request of each size had doubled its time to the
  // first token (a 512-token prompt after a 2,047-token profile step: 23.7 ms against 11.9,
  // docs/PERF.md). The preload below covers cuBLASLt's kernels for the sizes in between; without
  // the power-of-two steps the first request's TTFT measured the same (100 to 1,500 tokens,
  // Llama-3-8B and DeepSeek-V2-Lite, docs/perf-history "Twentieth round"), but they also run the
  // step-size dependent paths once (the routed experts' grouped GEMM between their one-token
  // GEMV and the per-expert GEMMs the profile step takes), for 0.2-0.5 s of start-up.
  std::vector<int32_t> sizes;
  for (int32_t k = 1; k < n; k = k < 8 ? k + 1 : 2 * k) sizes.push_back(k);
  for (int32_t k : sizes) {
    c.n_tokens = k;
    run_model({c});
  }
  // Then the GEMM kernels a step of any other size may pick, loaded now (Backend::preload_kernels:
  // a later row count whose own kernel was never loaded takes a preloaded one).
  backend_.preload_kernels(n);
  backend_.synchronize();
  cache_ = KvCache{};
  PAGELLM_LOG_INFO(
      "profile run: a %d-token step, then %zu warm-up steps of 1 to %d tokens, in %.2f s", n,
      sizes.size(), sizes.empty() ? 0 : sizes.back(),
      std::chrono::duration<double>(Clock::now() - t0).count());
}

void Engine::warm_up_sampling(const Tensor& logits) {
  // The device's sampling kernels load on their first launch (CUDA loads modules lazily): run
  // them once here, on the profile step's logits, so the first request does not pay for it.
  // Three rows cover the kernels' paths: greedy; temperature with top-k, top-p and logprobs;
  // min-p with penalties.
  if (!backend_.supports_sampling() || config_.host_sampling || logits.rows() < 1) return;
  const int32_t V = static_cast<int32_t>(model_.config().vocab_size);
  std::vector<SamplingParams> params(3);
  params[0].temperature = 0.0f;
  params[1].temperature = 0.8f;
  params[1].top_k = 50;
  params[1].top_p = 0.9f;
  params[1].logprobs = 5;
  params[2].min_p = 0.05f;
  params[2].repetition_penalty = 1.1f;
  params[2].presence_penalty = 0.5f;
  params[2].frequency_penalty = 0.5f;
  const std::vector<int32_t> tokens = {0, 1};
  std::vector<SampleRow> rows;
  for (const SamplingParams& p : params) {
    if (!p.validate(V).ok()) return;  // a vocabulary too small for these settings: skip it
    rows.push_back({&p, tokens, tokens, 0});
  }
  std::vector<SampleOutput> outs(rows.size());
  sample(logits, true, rows, std::vector<int64_t>(rows.size(), logits.rows() - 1), outs);
}

void Engine::step() {
  const auto t0 = Clock::now();
  // Requests finished before the step before began: no pick refers to them any more.
  retired_before_.clear();
  std::swap(retired_before_, retired_);
  // The device still runs the step before when that step's tokens are pending: planning this
  // one overlaps it.
  const bool overlapped = pending_.ticket != 0;
  propose_drafts();
  SchedulePlan plan = scheduler_->schedule(now_ms());
  for (uint64_t id : plan.preempted)
    if (auto it = live_.find(id); it != live_.end()) it->second->preemption_times.push_back(t0);
  finish_requests(plan.failed);
  if (plan.empty()) {
    if (overlapped) {
      read_pending();
      return;
    }
    // Nothing runnable now (e.g. dynamic batching waiting for its batch): wait a little for an
    // arrival or an abort rather than spin.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(1),
                 [&] { return stop_ || !inbox_.empty() || !aborts_.empty(); });
    return;
  }

  // Copy-on-write block copies, every layer, before the forward writes into them.
  for (const BlockCopy& c : plan.copies) {
    for (size_t l = 0; l < cache_.k.size(); ++l) {
      for (const Tensor* t : {&cache_.k[l], &cache_.v[l]}) {
        if (!t->defined()) continue;
        const int64_t bytes = dtype_bytes(t->dtype, t->stride[0]);
        backend_.copy(static_cast<char*>(t->data) + c.dst * bytes,
                      static_cast<char*>(t->data) + c.src * bytes, bytes);
      }
    }
  }

  // Pack the batch. A prefill chunk of a prompt_logprobs request returns logits for every row. A
  // decode whose input is the pending step's token reads it on the device: its id becomes
  // -(row + 1) of that step's results (Backend::take_sampled_tokens).
  std::vector<SeqChunk> chunks;
  chunks.reserve(plan.seqs.size());
  bool reads_pending = false;
  for (ScheduledSeq& s : plan.seqs) {
    Live& live = *live_.at(s.request_id);
    if (live.scheduled_time == Clock::time_point{}) live.scheduled_time = t0;
    for (int32_t& t : s.token_ids) {
      if (t != kPendingToken) continue;
      const int32_t pending_row = live.seqs[s.seq_index].pending_row;
      PAGELLM_CHECK_MSG(pending_row >= 0, "a pending token's step has no row for its sequence");
      t = -(pending_row + 1);
      reads_pending = true;
    }
    SeqChunk c;
    c.tokens = s.token_ids.data();
    c.n_tokens = static_cast<int32_t>(s.token_ids.size());
    c.start_pos = s.context_len - c.n_tokens;
    c.block_table = s.block_table.data();
    c.n_blocks = static_cast<int32_t>(s.block_table.size());
    const bool prompt_lp = live.req.params.prompt_logprobs && s.is_prefill && s.seq_index == 0 &&
                           c.start_pos < static_cast<int32_t>(live.req.prompt.size());
    // A verified draft wants a row per token: the next token and one after each guess.
    c.logits = prompt_lp || s.n_draft > 0 ? LogitsWanted::kAll
               : s.needs_logits           ? LogitsWanted::kLast
                                          : LogitsWanted::kNone;
    chunks.push_back(c);
  }
  const int64_t V = model_.config().vocab_size;
  const auto t_forward = Clock::now();  // the device idles from the last step's tokens to here
  // [n_logits, V] on the backend's device
  const Tensor device_logits = run_model(chunks, reads_pending ? pending_.ticket : 0);
  backend_.background_work();  // while the device runs the step just queued
  const bool constrained =
      std::any_of(plan.seqs.begin(), plan.seqs.end(), [&](const ScheduledSeq& s) {
        return s.needs_logits && live_.at(s.request_id)->req.grammar != nullptr;
      });
  const int64_t n_logits = device_logits.rows();
  // The logits stay on the device, and only tokens and logprobs come back, unless a chunk wants
  // prompt logprobs: the host computes those from every row.
  bool prompt_logprobs = false;
  for (size_t i = 0; i < chunks.size(); ++i)
    prompt_logprobs =
        prompt_logprobs || (chunks[i].logits == LogitsWanted::kAll && plan.seqs[i].n_draft == 0);
  // Guesses drawn from a draft's distribution are verified against the target's on the host.
  bool drawn_drafts = false;
  for (const ScheduledSeq& sd : plan.seqs)
    drawn_drafts =
        drawn_drafts ||
        (sd.n_draft > 0 && !live_.at(sd.request_id)->seqs[sd.seq_index].draft_probs.empty());
  const bool on_device =
      backend_.supports_sampling() && !config_.host_sampling && !prompt_logprobs && !drawn_drafts;
  logits_.resize(on_device ? 0 : static_cast<size_t>(n_logits) * V);
  if (n_logits > 0 && !on_device) download_(device_logits, logits_.data());

  // Gather the rows to sample (one per sample; n > 1 duplicates the prompt's row).
  std::vector<Pick> picks;
  std::vector<SampleRow> rows;
  std::vector<int64_t> sample_rows;  // the logits_ row each pick samples from
  int64_t row = 0;
  int64_t n_drafts = 0, n_draft_tokens = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    Live& live = *live_.at(s.request_id);
    int64_t sample_row = -1;
    if (s.n_draft > 0) {
      // A verified draft: row j samples the token after the sequence's last token and the
      // guesses before position j; token_ids = [last token, guess 0, ..., guess n_draft - 1].
      for (int32_t j = 0; j <= s.n_draft; ++j) {
        picks.push_back(
            {&live, s.seq_index, j, j < s.n_draft ? s.token_ids[1 + j] : -1, s.n_draft});
        sample_rows.push_back(row + j);
      }
      row += chunks[i].n_tokens;
      ++n_drafts;
      n_draft_tokens += s.n_draft;
      continue;
    }
    if (chunks[i].logits == LogitsWanted::kAll) {
      const int32_t n_prompt = static_cast<int32_t>(live.req.prompt.size());
      const int32_t top_n = *live.req.params.prompt_logprobs;
      for (int32_t k = 0; k < chunks[i].n_tokens; ++k) {
        const int32_t pos = chunks[i].start_pos + k;
        if (pos + 1 < n_prompt) {
          LogprobsResult r;
          compute_logprobs({logits_.data() + (row + k) * V, static_cast<size_t>(V)},
                           live.req.prompt[pos + 1], top_n, r);
          live.prompt_logprobs.push_back(std::move(r));
        }
      }
      if (s.needs_logits) sample_row = row + chunks[i].n_tokens - 1;
      row += chunks[i].n_tokens;
    } else if (chunks[i].logits == LogitsWanted::kLast) {
      sample_row = row++;
    }
    if (sample_row < 0) continue;
    for (int32_t j = 0; j < s.n_samples; ++j) {
      const int32_t idx = s.n_samples > 1 ? j : s.seq_index;
      picks.push_back({&live, idx});
      sample_rows.push_back(sample_row);
    }
  }
  // Grammar rows' masks are made on the host, now, while the device runs the forward; the
  // sampler applies them where it runs. When the step before was planned ahead, its tokens are
  // read first (this step's forward is queued already): the grammars must have taken them.
  bool read_before = false;
  if (constrained) {
    if (overlapped) {
      read_pending();
      read_before = true;
    }
    fill_grammar_masks(picks);
  }
  rows.reserve(picks.size());
  bool reads_outputs = false;  // a row's sampling depends on its earlier tokens' values
  // A draft's row j has the guesses before it as history: its RNG step and penalties are those
  // decoding without speculation would have there.
  size_t n_histories = 0;
  for (size_t k = 0; k < picks.size(); ++k) {
    const Pick& p = picks[k];
    const Live& live = *p.live;
    const Live::Seq& sq = live.seqs[p.seq_index];
    std::span<const int32_t> history = sq.outputs;
    if (p.draft_pos == 0) {
      if (spec_histories_.size() <= n_histories) spec_histories_.emplace_back();
      std::vector<int32_t>& h = spec_histories_[n_histories++];
      h.assign(sq.outputs.begin(), sq.outputs.end());
      // The draft's rows are picks k, k + 1, ...: each but the last carries its guess.
      for (size_t j = k; j < picks.size() && picks[j].draft_pos == static_cast<int32_t>(j - k) &&
                         picks[j].guess >= 0;
           ++j)
        h.push_back(picks[j].guess);
    }
    if (p.draft_pos > 0) {
      const std::vector<int32_t>& h = spec_histories_[n_histories - 1];
      history = std::span<const int32_t>(h.data(), sq.outputs.size() + p.draft_pos);
    }
    rows.push_back({&live.req.params, live.req.prompt, history, sq.seed});
    reads_outputs = reads_outputs || uses_output_values(live.req.params);
  }
  if (constrained) {  // the masks made during the forward, one per pick
    PAGELLM_CHECK(grammar_mask_of_.size() == picks.size());
    const size_t words = static_cast<size_t>(token_mask_words(V));
    for (size_t k = 0; k < picks.size(); ++k)
      if (grammar_mask_of_[k] >= 0)
        rows[k].allowed = {grammar_masks_.data() + grammar_mask_of_[k], words};
  }
  if (n_drafts > 0) {  // counted before emit_tokens counts the right guesses, whose events
    std::lock_guard<std::mutex> lock(mu_);  // may end a request its caller then reads stats for
    stats_.spec_drafts += n_drafts;
    stats_.spec_draft_tokens += n_draft_tokens;
  }
  std::vector<SampleOutput> outs(rows.size());
  uint64_t ticket = 0;
  if (!rows.empty()) {
    if (on_device) {
      ticket = sample_on_device(device_logits, rows, sample_rows);
    } else {
      sample(device_logits, false, rows, sample_rows, outs);
      if (drawn_drafts) verify_drawn_drafts(picks, rows, sample_rows, outs);
    }
  }
  // A proposer that reads the target's hidden rows takes them now, behind the sampling.
  if (spec_active_ && proposer_->reads_hidden()) observe_target(plan, chunks);

  // The step before's tokens, now that this step is queued behind it: their events and stops.
  if (overlapped && !read_before) read_pending();

  // Planning ahead: this step's tokens stay on the device and the next step is planned and
  // queued before the host reads them. Not when a row's sampling reads its earlier tokens'
  // values (penalties: the next step's row would be packed before they are known; a grammar's
  // next mask waits for them instead, see above), nor while speculating (the next step's
  // drafts follow this step's tokens).
  const bool ahead = config_.plan_ahead && ticket != 0 && !reads_outputs && !spec_active_ &&
                     scheduler_->can_plan_ahead();
  if (!ahead && ticket != 0) read_device_samples(ticket, packed_, outs);  // waits for the step
  const auto t_tokens = Clock::now();  // and from here to the next step's forward
  int64_t n_generated = 0;
  if (ahead) {
    std::vector<SampledToken> results;
    results.reserve(picks.size());
    for (size_t k = 0; k < picks.size(); ++k) {
      Live& live = *picks[k].live;
      Live::Seq& sq = live.seqs[picks[k].seq_index];
      if (live.done || sq.stop->finished()) continue;  // ended by the step before's tokens
      sq.outputs.push_back(kPendingToken);
      sq.pending_row = static_cast<int32_t>(k);
      results.push_back({live.id, picks[k].seq_index, kPendingToken, FinishReason::kNone});
    }
    n_generated = static_cast<int64_t>(results.size());
    // Requests that reach max_tokens with this step complete here; they are reported once their
    // last tokens are read.
    pending_.finished = scheduler_->on_step_done(results);
    pending_.ticket = ticket;
    pending_.picks = std::move(picks);
    std::swap(pending_.packed, packed_);
  } else {
    std::vector<SampledToken> results;
    std::vector<uint64_t> failed;
    n_generated = emit_tokens(picks, outs, false, results, failed);
    // A failed row has no token: its request ends first, so the scheduler does not wait for one.
    fail_sampling(failed);
    finish_requests(scheduler_->on_step_done(results));
  }
  const auto t_end = Clock::now();
  const double dt = std::chrono::duration<double>(t_end - t0).count();
  // The host's work while the device idles: none before the forward when the step before was
  // still running, none after it when the next step is planned ahead.
  const double host = (overlapped ? 0.0 : std::chrono::duration<double>(t_forward - t0).count()) +
                      (ahead ? 0.0 : std::chrono::duration<double>(t_end - t_tokens).count());
  PAGELLM_LOG_DEBUG("step: %lld tokens of %zu sequences in %.3f ms%s",
                    static_cast<long long>(plan.n_tokens), plan.seqs.size(), dt * 1e3,
                    ahead ? " (next planned ahead)" : "");
  const int32_t n_tokens = plan.n_tokens;
  scheduler_->recycle(std::move(plan));  // its buffers serve the next step's plan
  if (!ahead) {  // no pending step: no pick refers to a finished request any more
    retired_.clear();
    retired_before_.clear();
  }
  publish_stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.generation_tokens_total += n_generated;
  stats_.steps += 1;
  stats_.steps_planned_ahead += ahead ? 1 : 0;
  stats_.busy_seconds += dt;
  stats_.host_seconds += host;
  const auto& bounds = EngineStats::kIterationTokenBuckets;
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds.begin(), bounds.end(), n_tokens) - bounds.begin());
  stats_.iteration_tokens[bucket] += 1;
  stats_.iteration_tokens_sum += n_tokens;
}

std::vector<Engine::SeqPicks> Engine::group_by_sequence(const std::vector<Pick>& picks) {
  std::vector<SeqPicks> groups;
  for (size_t k = 0; k < picks.size();) {
    int32_t n = 1;
    if (picks[k].draft_pos == 0)
      while (k + n < picks.size() && picks[k + n].draft_pos == n) ++n;
    groups.push_back({k, n});
    k += n;
  }
  return groups;
}

// Runs fn(i) for i in [0, n), across the thread pool when there is more than one.
template <typename Fn>
static void for_each_parallel(size_t n, Fn&& fn) {
  if (n > 1) {
    ThreadPool::global().parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(static_cast<size_t>(i));
    });
  } else if (n == 1) {
    fn(0);
  }
}

void Engine::fill_grammar_masks(const std::vector<Pick>& picks) {
  const int64_t words = token_mask_words(model_.config().vocab_size);
  // A unit of work is one sequence's rows, made one after another, each after the guesses before
  // it.
  struct Item {
    Live::Seq* seq;
    const Live* live;
    size_t first_pick;
    int32_t n_rows;
  };
  std::vector<Item> items;
  for (const SeqPicks& g : group_by_sequence(picks)) {
    Live* live = picks[g.first_pick].live;
    items.push_back({&live->seqs[picks[g.first_pick].seq_index], live, g.first_pick, g.n_rows});
  }
  const size_t n_picks = picks.size();
  // A thought is the model's own: no mask inside it.
  auto bound = [](const Live::Seq& s) {
    return s.grammar && s.phase != Live::Seq::Phase::kThinking;
  };
  // A sequence that ended with the step before (read just now) has rows this step discards.
  auto ended = [](const Item& it) { return it.live->done || it.seq->stop->finished(); };
  grammar_mask_of_.assign(n_picks, -1);
  std::vector<size_t> work;  // the bound items
  int64_t n_masks = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    if (!bound(*items[k].seq)) continue;
    for (int32_t j = 0; j < items[k].n_rows; ++j)
      grammar_mask_of_[items[k].first_pick + j] = (n_masks + j) * words;
    n_masks += items[k].n_rows;
    work.push_back(k);
  }
  grammar_masks_.resize(static_cast<size_t>(n_masks * words));
  auto fill = [&](size_t i) {
    const Item& it = items[work[i]];
    GrammarMatcher& m = *it.seq->grammar;
    int32_t advanced = 0;
    bool open = !ended(it);  // the guesses so far are the grammar's
    for (int32_t j = 0; j < it.n_rows; ++j) {
      uint32_t* mask = grammar_masks_.data() + grammar_mask_of_[it.first_pick + j];
      if (!open) {  // past a guess the grammar refuses, or after the end: a row never used
        std::fill(mask, mask + words, ~0u);
        continue;
      }
      m.fill_mask({mask, static_cast<size_t>(words)});
      if (it.seq->phase == Live::Seq::Phase::kMayThink) {  // or open a thought
        const int32_t t = it.live->req.thinking->think_start;
        mask[t / 32] |= 1u << (t % 32);
      }
      if (j + 1 < it.n_rows) {
        const int32_t g = picks[it.first_pick + j].guess;
        open = (mask[g / 32] >> (g % 32) & 1u) && m.accept(g);
        advanced += open ? 1 : 0;
      }
    }
    if (advanced > 0) m.rollback(advanced);  // the tokens the step keeps advance it for good
  };
  const auto t0 = Clock::now();
  for_each_parallel(work.size(), fill);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.grammar_mask_steps += 1;
  stats_.grammar_mask_seconds += dt;
}

bool Engine::uses_output_values(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

void Engine::read_pending() {
  std::vector<SampleOutput> outs(pending_.picks.size());
  read_device_samples(pending_.ticket, pending_.packed, outs);
  std::vector<SampledToken> results;
  std::vector<uint64_t> failed;
  emit_tokens(pending_.picks, outs, true, results, failed);
  fail_sampling(failed);  // before the scheduler looks for their tokens
  // Stops end their sequences now; the requests that reached max_tokens when the step was
  // planned ahead end after their last events.
  std::vector<FinishedRequest> finished = scheduler_->resolve_tokens(results);
  finished.insert(finished.end(), pending_.finished.begin(), pending_.finished.end());
  finish_requests(finished);
  pending_.ticket = 0;
  pending_.picks.clear();
  pending_.finished.clear();
}

void Engine::advance_grammars(const std::vector<Pick>& picks,
                              const std::vector<SampleOutput>& outs) {
  grammar_takes_.assign(picks.size(), GrammarTake{});
  if (std::none_of(picks.begin(), picks.end(),
                   [](const Pick& p) { return p.live->seqs[p.seq_index].grammar != nullptr; }))
    return;                    // the usual step: nothing to group
  std::vector<SeqPicks> work;  // the sequences under a grammar that may take tokens
  for (const SeqPicks& g : group_by_sequence(picks)) {
    const Live& live = *picks[g.first_pick].live;
    const Live::Seq& sq = live.seqs[picks[g.first_pick].seq_index];
    if (sq.grammar && !live.done && !sq.stop->finished()) work.push_back(g);
  }
  using Phase = Live::Seq::Phase;
  for_each_parallel(work.size(), [&](size_t i) {
    for (size_t k = work[i].first_pick; k < work[i].first_pick + work[i].n_rows; ++k) {
      if (!outs[k].status.ok()) continue;  // as emit_tokens skips it
      Live& live = *picks[k].live;
      Live::Seq& sq = live.seqs[picks[k].seq_index];
      const int32_t tok = outs[k].token;
      // The grammar advances with the token its mask let through; a thought is the model's own.
      GrammarTake& t = grammar_takes_[k];
      t.taken = true;
      if (sq.phase == Phase::kThinking) {
        if (tok == live.req.thinking->think_end) sq.phase = Phase::kAnswer;
      } else if (sq.phase == Phase::kMayThink && tok == live.req.thinking->think_start) {
        sq.phase = Phase::kThinking;
      } else {
        sq.phase = Phase::kAnswer;
        t.refused = !sq.grammar->accept(tok);
      }
      t.terminated = sq.grammar->terminated();
      // A verified draft's rows after the first wrong guess are not the sequence's.
      if (picks[k].draft_pos >= 0 && !(picks[k].guess >= 0 && tok == picks[k].guess)) break;
    }
  });
}

int64_t Engine::emit_tokens(const std::vector<Pick>& picks, std::vector<SampleOutput>& outs,
                            bool resolving, std::vector<SampledToken>& results,
                            std::vector<uint64_t>& failed) {
  int64_t n_generated = 0;
  // The grammars first, in parallel: an accept costs tens of microseconds, hundreds of them a
  // step at large batches.
  advance_grammars(picks, outs);
  // A verified draft's rows count while each token is the guess the next row assumed: the
  // first that is not ends the draft (its token is the sequence's, the rows after it are not).
  const Live::Seq* draft_ended = nullptr;
  std::vector<int64_t> accepted;  // right guesses by position
  for (size_t k = 0; k < picks.size(); ++k) {
    Live& live = *picks[k].live;
    if (live.done) continue;  // aborted or failed meanwhile
    const int32_t idx = picks[k].seq_index;
    Live::Seq& sq = live.seqs[idx];
    const int32_t draft_pos = picks[k].draft_pos;
    if (draft_pos > 0 && draft_ended == &sq) continue;
    // Stopped while this step was in flight (the step before it was read after it was queued).
    if (sq.stop->finished()) continue;
    if (!outs[k].status.ok()) {
      if (std::find(failed.begin(), failed.end(), live.id) == failed.end())
        failed.push_back(live.id);
      live.prompt_logprobs.clear();
      continue;
    }
    const int32_t tok = outs[k].token;
    if (draft_pos >= 0) {
      const int32_t guess = picks[k].guess;
      if (guess >= 0 && tok == guess) {
        if (accepted.size() <= static_cast<size_t>(draft_pos)) accepted.resize(draft_pos + 1);
        ++accepted[draft_pos];
      } else {
        // The draft is over: draft_pos of its guesses were right.
        draft_ended = &sq;
        const float rate = static_cast<float>(draft_pos) / static_cast<float>(picks[k].n_draft);
        sq.spec_rate = (1.0f - kSpecRateWeight) * sq.spec_rate + kSpecRateWeight * rate;
        if (draft_pos == 0 || sq.spec_rate < kMinSpecRate) {  // draft less often for a while
          sq.spec_backoff = std::clamp(2 * sq.spec_backoff, 1, kMaxSpecBackoff);
          sq.spec_skip = sq.spec_backoff;
        } else {
          sq.spec_backoff = 0;
        }
      }
    }
    if (resolving) {
      PAGELLM_CHECK(!sq.outputs.empty() && sq.outputs.back() == kPendingToken);
      sq.outputs.back() = tok;
      sq.pending_row = -1;
    } else {
      sq.outputs.push_back(tok);
      ++n_generated;
    }
    const int32_t n_out = static_cast<int32_t>(sq.outputs.size());
    const int32_t total = static_cast<int32_t>(live.req.prompt.size()) + n_out;
    const bool last = n_out >= *live.req.params.max_tokens || total >= max_model_len_;
    std::string delta;
    if (sq.detok) {
      auto d = sq.detok->add(tok);
      if (d.ok()) delta = std::move(*d);
      if (last) {  // no more tokens will come: release what the detokenizer held back
        auto rest = sq.detok->finish();
        if (rest.ok()) delta += *rest;
      }
    }
    StopUpdate u = sq.stop->append(tok, delta);
    // Once the grammar has ended (its stop token, which ignore_eos does not keep going), so does
    // the sequence.
    const GrammarTake& take = grammar_takes_[k];
    PAGELLM_CHECK(take.taken || !sq.grammar);
    if (take.refused)
      PAGELLM_LOG_WARN("request %llu: token %d is not allowed by its grammar",
                       static_cast<unsigned long long>(live.id), tok);
    if (take.terminated && u.finish == FinishReason::kNone) {
      u.text += sq.stop->finish(FinishReason::kStop);
      u.finish = FinishReason::kStop;
    }
    if (u.finish == FinishReason::kNone && last) {
      u.text += sq.stop->finish(FinishReason::kLength);
      u.finish = FinishReason::kLength;
    }
    EngineOutput o;
    o.request_id = live.id;
    o.seq_index = idx;
    o.token_ids.push_back(tok);
    o.text = std::move(u.text);
    if (live.req.params.logprobs) {
      LogprobsResult r;
      r.logprob = outs[k].logprob;
      r.rank = outs[k].rank;
      r.top = std::move(outs[k].top_logprobs);
      o.logprobs.push_back(std::move(r));
    }
    if (idx == 0 && !live.prompt_logprobs_sent && live.req.params.prompt_logprobs) {
      o.prompt_logprobs = std::move(live.prompt_logprobs);
      live.prompt_logprobs_sent = true;
    }
    o.finish = u.finish;
    o.stop_token = u.stop_token;
    o.stop_string = u.stop_string;
    live.cb(std::move(o));
    results.push_back({live.id, idx, tok, u.finish});
  }
  if (!accepted.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t j = 0; j < accepted.size(); ++j) {
      stats_.spec_accepted_tokens += accepted[j];
      stats_.spec_accepted_per_position[j] += accepted[j];
    }
  }
  return n_generated;
}

void Engine::verify_drawn_drafts(const std::vector<Pick>& picks, const std::vector<SampleRow>& rows,
                                 const std::vector<int64_t>& sample_rows,
                                 std::vector<SampleOutput>& outs) {
  const int64_t V = model_.config().vocab_size;
  std::vector<TokenProb> p;
  for (const SeqPicks& g : group_by_sequence(picks)) {
    const Pick& first = picks[g.first_pick];
    Live::Seq& sq = first.live->seqs[first.seq_index];
    const int32_t n_draft = first.draft_pos == 0 ? first.n_draft : 0;
    if (n_draft == 0 || static_cast<int32_t>(sq.draft_probs.size()) < n_draft) continue;
    // Guess j against row j's distribution: kept, or the residual's token ends the draft. When
    // every guess is kept, the last row keeps the draw sample() made, as plain decoding's.
    for (int32_t j = 0; j < n_draft; ++j) {
      const size_t k = g.first_pick + j;
      if (!outs[k].status.ok()) break;  // the row's error stands
      const std::span<const float> raw(logits_.data() + sample_rows[k] * V, static_cast<size_t>(V));
      Status st = sampler_->distribution(raw, rows[k], p);
      if (!st.ok()) {
        outs[k].status = st;
        break;
      }
      const uint64_t step = rows[k].output_tokens.size();
      const std::vector<TokenProb>& q = sq.draft_probs[j];
      const int32_t guess = picks[k].guess;
      if (keep_guess(p, q, guess, uniform01(stream_seed(sq.seed, SpecStream::kAccept), step))) {
        set_sampled_token(raw, *rows[k].params, guess, outs[k]);
        continue;
      }
      const int32_t t =
          draw_residual(p, q, uniform01(stream_seed(sq.seed, SpecStream::kResidual), step));
      set_sampled_token(raw, *rows[k].params, t, outs[k]);
      break;
    }
    sq.draft_probs.clear();
  }
}

int32_t Engine::speculation_slots() const {
  // A slot of the proposer's own cache for every sequence that may be drafted for at once;
  // allocated before the KV pool, so the pool is sized from the memory left after them.
  const int32_t off = config_.speculative.disable_by_batch_size;
  const int32_t all = config_.scheduler.max_num_seqs;
  return off > 0 ? std::min(off, all) : all;
}

void Engine::observe_target(const SchedulePlan& plan, const std::vector<SeqChunk>& chunks) {
  observed_.clear();
  int64_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const Live& live = *live_.at(s.request_id);
    TargetChunk t;
    t.request_id = s.request_id;
    t.seq_index = s.seq_index;
    t.start_pos = chunks[i].start_pos;
    t.n_tokens = chunks[i].n_tokens;
    t.first_row = row;
    t.tokens = chunks[i].tokens;
    t.prompt = live.req.prompt;
    t.outputs = live.seqs[s.seq_index].outputs;
    observed_.push_back(t);
    row += chunks[i].n_tokens;
  }
  const auto t0 = Clock::now();
  proposer_->observe(observed_, model_.last_hidden());
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spec_draft_seconds += dt;  // the proposer's work for the next drafts
}

void Engine::propose_drafts() {
  spec_active_ = false;
  if (!proposer_) return;
  const SpeculativeConfig& sc = config_.speculative;
  if (sc.disable_by_batch_size > 0 && scheduler_->n_running_seqs() >= sc.disable_by_batch_size)
    return;
  // Speculating: this step's tokens are read before the next step is planned (no planning
  // ahead), so that the next step can have drafts too.
  spec_active_ = true;
  // A step whose tokens are still on the device: guesses would follow unknown tokens.
  if (pending_.ticket != 0) return;
  proposals_.clear();
  for (auto& [id, lp] : live_) {
    Live& live = *lp;
    if (live.done) continue;
    const int32_t n_prompt = static_cast<int32_t>(live.req.prompt.size());
    for (int32_t i = 0; i < static_cast<int32_t>(live.seqs.size()); ++i) {
      Live::Seq& sq = live.seqs[i];
      sq.draft_probs.clear();  // a proposal serves one step
      if (sq.outputs.empty() || sq.stop->finished() || !scheduler_->next_is_decode(id, i)) continue;
      // Under a grammar, only while it binds the answer: a thought's end would change which
      // rows it binds in the middle of a draft.
      if (sq.grammar && sq.phase != Live::Seq::Phase::kAnswer) continue;
      if (sq.spec_skip > 0) {
        --sq.spec_skip;
        continue;
      }
      const int32_t n_out = static_cast<int32_t>(sq.outputs.size());
      // All guesses right gives one more token than guesses: within max_tokens and the context.
      const int32_t k = std::min({sc.num_tokens, *live.req.params.max_tokens - n_out - 1,
                                  max_model_len_ - n_prompt - n_out});
      if (k <= 0) continue;
      ProposalRequest p{id, i, {}, k, nullptr};
      if (!live.req.params.is_greedy()) {  // a proposer with distributions may draw its guesses
        p.params = &live.req.params;
        p.n_prompt = n_prompt;
        p.seed = sq.seed;
        p.draft_probs = &sq.draft_probs;
      }
      proposals_.push_back(p);
    }
  }
  // The sequences' tokens and drafts, now that their number is known (the spans and pointers
  // into these vectors must not move).
  if (spec_tokens_.size() < proposals_.size()) {
    spec_tokens_.resize(proposals_.size());
    spec_drafts_.resize(proposals_.size());
  }
  for (size_t j = 0; j < proposals_.size(); ++j) {
    ProposalRequest& p = proposals_[j];
    const Live& live = *live_.at(p.request_id);
    const Live::Seq& sq = live.seqs[p.seq_index];
    std::vector<int32_t>& tokens = spec_tokens_[j];
    tokens.assign(live.req.prompt.begin(), live.req.prompt.end());
    tokens.insert(tokens.end(), sq.outputs.begin(), sq.outputs.end());
    p.tokens = tokens;
    p.draft = &spec_drafts_[j];
  }
  if (proposals_.empty()) return;
  const auto t0 = Clock::now();
  proposer_->propose(proposals_);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const ProposalRequest& p : proposals_)
    if (!p.draft->empty()) scheduler_->set_draft(p.request_id, p.seq_index, *p.draft);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spec_draft_seconds += dt;
}

void Engine::fail_sampling(const std::vector<uint64_t>& failed) {
  for (uint64_t id : failed) {
    FinishedRequest info;
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    if (scheduler_->abort(id, &info)) {
      info.error = "sampling failed (non-finite logits)";
      finish_request(*it->second, info);
    }
  }
}

SamplerConfig Engine::sampler_config() const {
  SamplerConfig sc;
  sc.vocab_size = static_cast<int32_t>(model_.config().vocab_size);
  sc.eos_token_ids = model_.config().eos_token_ids;
  return sc;
}

uint64_t Engine::sample_on_device(const Tensor& logits, const std::vector<SampleRow>& rows,
                                  const std::vector<int64_t>& sample_rows) {
  // One upload of the rows, their sparse edits and grammar masks, one kernel, one download of the
  // results.
  if (!packer_) packer_ = std::make_unique<SampleBatchPacker>(sampler_config());
  packer_->pack(rows, sample_rows, packed_);
  return backend_.sample_async(logits, packed_.inputs());
}

void Engine::read_device_samples(uint64_t ticket, const PackedSampleBatch& packed,
                                 std::vector<SampleOutput>& outs) {
  device_results_.resize(packed.rows.size());
  backend_.sample_results(ticket, device_results_.data());
  SampleBatchPacker::unpack(packed, device_results_, outs);
}

void Engine::sample(const Tensor& logits, bool on_device, const std::vector<SampleRow>& rows,
                    const std::vector<int64_t>& sample_rows, std::vector<SampleOutput>& outs) {
  const int64_t V = model_.config().vocab_size;
  if (on_device) {
    read_device_samples(sample_on_device(logits, rows, sample_rows), packed_, outs);
    return;
  }
  if (!sampler_) sampler_ = std::make_unique<Sampler>(sampler_config());
  // Usually (decodes and final prompt chunks, n == 1) the sampled rows are exactly logits_ in
  // order and the sampler reads them in place; prompt-logprob chunks and n > 1 need a packed copy.
  const int64_t n_logits = static_cast<int64_t>(logits_.size()) / V;
  bool in_place = static_cast<int64_t>(sample_rows.size()) == n_logits;
  for (size_t k = 0; in_place && k < sample_rows.size(); ++k)
    in_place = sample_rows[k] == static_cast<int64_t>(k);
  float* base = logits_.data();
  if (!in_place) {
    sample_logits_.resize(sample_rows.size() * V);
    for (size_t k = 0; k < sample_rows.size(); ++k)
      std::copy_n(logits_.data() + sample_rows[k] * V, V, sample_logits_.data() + k * V);
    base = sample_logits_.data();
  }
  Tensor lt(base, DType::kF32, {static_cast<int64_t>(rows.size()), V});
  Status s = sampler_->sample(lt, rows, outs);
  PAGELLM_CHECK_MSG(s.ok(), s.to_string().c_str());  // shapes are ours: a bug if wrong
}

}  // namespace pagellm
