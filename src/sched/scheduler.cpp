#include "sched/scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "core/check.h"
#include "core/log.h"
#include "kv/kv_layout.h"

namespace pagellm {

// ---------------------------------------------------------------------------------------------
// Batching policy

std::string BatchingPolicy::to_string() const {
  switch (mode) {
    case BatchingMode::kContinuous: return "continuous";
    case BatchingMode::kStatic: return "static:" + std::to_string(batch_size);
    case BatchingMode::kDynamic: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "dynamic:%d,%g", batch_size, max_wait_ms);
      return buf;
    }
  }
  return "?";
}

namespace {

bool parse_int(std::string_view s, int32_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(std::string_view s, double* out) {
  std::string copy(s);
  char* end = nullptr;
  *out = std::strtod(copy.c_str(), &end);
  return !copy.empty() && end == copy.c_str() + copy.size() && std::isfinite(*out);
}

}  // namespace

Result<BatchingPolicy> parse_batching_policy(std::string_view text) {
  const std::string bad = "batching policy '" + std::string(text) +
                          "': expected continuous, static:B or dynamic:B,T (B >= 1 requests, "
                          "T >= 0 ms)";
  BatchingPolicy p;
  if (text == "continuous") return p;
  if (text.starts_with("static:")) {
    p.mode = BatchingMode::kStatic;
    if (!parse_int(text.substr(7), &p.batch_size) || p.batch_size < 1) return invalid_argument(bad);
    return p;
  }
  if (text.starts_with("dynamic:")) {
    p.mode = BatchingMode::kDynamic;
    std::string_view rest = text.substr(8);
    size_t comma = rest.find(',');
    if (comma == std::string_view::npos || !parse_int(rest.substr(0, comma), &p.batch_size) ||
        p.batch_size < 1 || !parse_double(rest.substr(comma + 1), &p.max_wait_ms) ||
        p.max_wait_ms < 0) {
      return invalid_argument(bad);
    }
    return p;
  }
  return invalid_argument(bad);
}

// ---------------------------------------------------------------------------------------------
// Construction

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerConfig& config,
                                                     const KvCacheConfig& kv_config) {
  PAGELLM_RETURN_IF_ERROR(BlockManager::validate(kv_config));
  if (config.max_num_batched_tokens < 1) {
    return invalid_argument("scheduler: max_num_batched_tokens must be >= 1, got " +
                            std::to_string(config.max_num_batched_tokens));
  }
  if (config.max_num_seqs < 1) {
    return invalid_argument("scheduler: max_num_seqs must be >= 1, got " +
                            std::to_string(config.max_num_seqs));
  }
  if (config.max_num_batched_tokens < config.max_num_seqs) {
    // Otherwise some running sequences could never get their decode token into a step.
    return invalid_argument("scheduler: max_num_batched_tokens (" +
                            std::to_string(config.max_num_batched_tokens) +
                            ") must be >= max_num_seqs (" + std::to_string(config.max_num_seqs) +
                            ")");
  }
  if (config.max_waiting < 0) {
    return invalid_argument("scheduler: max_waiting must be >= 0, got " +
                            std::to_string(config.max_waiting));
  }
  if (!(config.watermark >= 0.0 && config.watermark < 1.0)) {
    return invalid_argument("scheduler: watermark must be in [0, 1), got " +
                            std::to_string(config.watermark));
  }
  if (config.batching.mode != BatchingMode::kContinuous &&
      (config.batching.batch_size < 1 || config.batching.max_wait_ms < 0)) {
    return invalid_argument("scheduler: batching policy " + config.batching.to_string() +
                            " needs B >= 1 and T >= 0");
  }
  return std::unique_ptr<Scheduler>(new Scheduler(config, kv_config));
}

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config)
    : config_(config), mgr_(kv_config) {
  watermark_blocks_ = static_cast<int32_t>(config.watermark * mgr_.n_blocks());
}

// ---------------------------------------------------------------------------------------------
// Requests in and out

Status Scheduler::add_request(RequestSpec spec) {
  const std::string who = "request " + std::to_string(spec.id);
  if (spec.prompt.empty()) return invalid_argument(who + ": prompt is empty");
  if (spec.max_tokens < 1) {
    return invalid_argument(who + ": max_tokens must be >= 1, got " +
                            std::to_string(spec.max_tokens));
  }
  if (spec.n < 1) return invalid_argument(who + ": n must be >= 1, got " + std::to_string(spec.n));
  if (spec.n > config_.max_num_seqs) {
    return invalid_argument(who + ": n = " + std::to_string(spec.n) + " exceeds max_num_seqs = " +
                            std::to_string(config_.max_num_seqs));
  }
  const int64_t prompt_len = static_cast<int64_t>(spec.prompt.size());
  if (prompt_len + spec.max_tokens > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(who + ": prompt + max_tokens overflows");
  }
  if (requests_.count(spec.id)) return invalid_argument(who + ": id is already in use");
  // Worst case: every sequence reaches prompt + max_tokens - 1 tokens with KV (the last sampled
  // token is never computed); the prompt's full blocks are shared by the n samples.
  const int32_t bs = mgr_.block_size();
  const int64_t shared = prompt_len / bs;
  const int64_t per_seq = blocks_for_tokens(prompt_len + spec.max_tokens - 1, bs) - shared;
  const int64_t worst = shared + spec.n * per_seq;
  if (worst > mgr_.n_blocks()) {
    return invalid_argument(who + ": needs up to " + std::to_string(worst) + " KV blocks (prompt " +
                            std::to_string(prompt_len) + " + max_tokens " +
                            std::to_string(spec.max_tokens) + ", n = " + std::to_string(spec.n) +
                            ") but the cache holds " + std::to_string(mgr_.n_blocks()) +
                            " blocks of " + std::to_string(bs) + " tokens");
  }
  if (static_cast<int32_t>(waiting_.size()) >= config_.max_waiting) {
    return resource_exhausted("waiting queue is full (" + std::to_string(config_.max_waiting) +
                              " requests); retry later");
  }

  auto r = std::make_unique<Request>();
  r->id = spec.id;
  r->prompt_len = static_cast<int32_t>(prompt_len);
  r->max_tokens = spec.max_tokens;
  r->n = spec.n;
  r->extra_hash = hash_extra_keys(spec.extra_keys);
  r->arrival_seq = next_arrival_++;
  r->arrival_ms = spec.arrival_ms;
  r->state = RequestState::kWaiting;
  r->seqs.reserve(spec.n);
  for (int32_t i = 0; i < spec.n; ++i) {
    Sequence s{.index = i, .tokens = {}, .n_computed = 0, .table = BlockTable(bs)};
    s.tokens = i == 0 ? std::move(spec.prompt) : r->seqs.front().tokens;
    r->seqs.push_back(std::move(s));
  }
  waiting_.push_back(r.get());
  requests_.emplace(spec.id, std::move(r));
  maybe_check();
  return {};
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

FinishedRequest Scheduler::summarize(const Request& r) const {
  FinishedRequest f;
  f.id = r.id;
  f.state = r.state;
  f.error = r.error;
  f.prompt_len = r.prompt_len;
  f.n_cached_tokens = r.n_cached_tokens;
  f.n_preemptions = r.n_preemptions;
  for (const Sequence& s : r.seqs) {
    f.reasons.push_back(s.finish);
    f.n_output_tokens += s.n_tokens() - r.prompt_len;
  }
  return f;
}

void Scheduler::release_all(Request* r) {
  for (Sequence& s : r->seqs) {
    s.table.release(mgr_);
    s.n_computed = 0;
    s.n_draft_in_flight = 0;
    s.draft.clear();
  }
}

void Scheduler::remove_running(const Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  PAGELLM_CHECK(it != running_.end());
  running_.erase(it);
  running_seqs_ -= r->n_live();
}

// Forgets a request that reached a terminal state and keeps the batch count.
void Scheduler::forget(Request* r) {
  if (config_.batching.mode != BatchingMode::kContinuous && r->batch_id == current_batch_ &&
      current_batch_ != 0) {
    --batch_open_;
  }
  requests_.erase(r->id);
}

bool Scheduler::abort(RequestId id, FinishedRequest* info) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  end_aborted(r);
  if (info) *info = summarize(*r);
  forget(r);
  maybe_check();
  return true;
}

// ---------------------------------------------------------------------------------------------
// Planning a step

bool Scheduler::is_decode(const Request& r, const Sequence& s) const {
  return s.n_pending() == 1 && s.n_tokens() > r.prompt_len;
}

void Scheduler::drop_entries(const Request* r) {
  // Only while planning: a request preempted or aborted after it was scheduled this step loses its
  // entries (and their copy ops, whose destinations were its own blocks) and refunds the budget.
  auto it = std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
    if (e.req != r) return false;
    budget_ += static_cast<int32_t>(e.seq.token_ids.size());
    return true;
  });
  entries_.erase(it, entries_.end());
}

void Scheduler::emit(Request* r, Sequence& s, int32_t n, bool is_prefill) {
  PAGELLM_CHECK(n >= 1 && n <= s.n_pending() && n <= budget_);
  const int32_t begin = s.n_computed;
  const int32_t end = begin + n;
  Entry e{r, {}};
  if (!spare_seqs_.empty()) {  // a recycled sequence's buffers; every field is set below
    e.seq = std::move(spare_seqs_.back());
    spare_seqs_.pop_back();
  }
  ScheduledSeq& q = e.seq;
  q.copies.clear();
  s.table.prepare_write(mgr_, begin, end, &q.copies);
  q.request_id = r->id;
  q.seq_index = s.index;
  q.is_prefill = is_prefill;
  q.token_ids.assign(s.tokens.begin() + begin, s.tokens.begin() + end);
  q.block_table = s.table.blocks();
  q.context_len = end;
  q.needs_logits = end == s.n_tokens();
  q.n_samples = q.needs_logits ? (r->forked ? 1 : r->n) : 0;
  q.n_draft = 0;
  s.n_computed = end;
  budget_ -= n;
  entries_.push_back(std::move(e));
}

void Scheduler::preempt(Request* r) {
  PAGELLM_LOG_DEBUG("sched: preempting request %llu (%d blocks free)",
                    static_cast<unsigned long long>(r->id), mgr_.n_free());
  drop_entries(r);
  remove_running(r);
  release_all(r);  // full blocks stay findable in the prefix cache until evicted
  if (r->forked) {
    // On resumption the first live sequence recomputes the prompt once; the others wait for it
    // and share its full prompt blocks (maybe_unpark), as they did before preemption.
    bool leader = true;
    for (Sequence& s : r->seqs) {
      if (s.finished()) continue;
      s.parked = !leader;
      leader = false;
    }
  }
  r->state = RequestState::kPreempted;
  ++r->n_preemptions;
  ++n_preemptions_;
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](const Request* w) { return w->arrival_seq > r->arrival_seq; });
  waiting_.insert(pos, r);
  if (plan_) plan_->preempted.push_back(r->id);
}

void Scheduler::end_aborted(Request* r) {
  if (r->state == RequestState::kRunning) {
    drop_entries(r);
    remove_running(r);
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), r);
    PAGELLM_CHECK(w != waiting_.end());
    waiting_.erase(w);
  }
  release_all(r);
  r->state = RequestState::kAborted;
  for (Sequence& s : r->seqs) {
    if (!s.finished()) s.finish = FinishReason::kAbort;
  }
}

void Scheduler::fail(Request* r, std::string reason) {
  PAGELLM_LOG_WARN("sched: request %llu failed: %s", static_cast<unsigned long long>(r->id),
                   reason.c_str());
  end_aborted(r);
  r->error = std::move(reason);
  if (plan_) plan_->failed.push_back(summarize(*r));
  forget(r);
}

bool Scheduler::schedule_running(Request* r, Sequence& s, int32_t want) {
  for (;;) {
    const int32_t n = s.table.max_writable(mgr_, s.n_computed, want, mgr_.n_free());
    if (n > 0) {
      emit(r, s, n, !is_decode(*r, s));
      return true;
    }
    // Not even one token fits: free the newest running request's blocks.
    Request* victim = running_.back();
    if (victim == r) {
      if (running_.size() == 1) {
        fail(r, "the KV cache (" + std::to_string(mgr_.n_blocks()) + " blocks of " +
                    std::to_string(mgr_.block_size()) + " tokens) cannot hold this request's " +
                    std::to_string(r->n_live()) + " sequence(s) of up to " +
                    std::to_string(s.n_tokens()) + " tokens");
      } else {
        preempt(r);
      }
      return false;
    }
    preempt(victim);
  }
}

bool Scheduler::try_admit(Request* r) {
  // The sequences to (re)compute: seq 0 of a fresh request, every live one of a forked request.
  std::vector<Sequence*> active;
  for (Sequence& s : r->seqs) {
    if (r->is_active(s)) active.push_back(&s);
  }
  PAGELLM_CHECK(!active.empty());
  const int32_t bs = mgr_.block_size();

  // Longest cached prefixes, not yet acquired. Hits on blocks of refcount 0 will leave the free
  // list when acquired, so they count against the free blocks (once, even if shared).
  std::vector<std::vector<BlockId>> hits(active.size());
  std::vector<BlockId> revived;
  for (size_t k = 0; k < active.size(); ++k) {
    active[k]->table.match_cached_prefix(mgr_, active[k]->tokens, r->extra_hash, &hits[k]);
    for (BlockId b : hits[k]) {
      if (mgr_.ref_count(b) == 0) revived.push_back(b);
    }
  }
  std::sort(revived.begin(), revived.end());
  revived.erase(std::unique(revived.begin(), revived.end()), revived.end());

  // Chunks within the budget; every new block must fit above the watermark. When nothing is
  // running nothing will ever free blocks, so the watermark is waived and chunks shrink to fit.
  const bool alone = running_.empty();
  int32_t avail = mgr_.n_free() - static_cast<int32_t>(revived.size()) -
                  (alone ? 0 : watermark_blocks_);
  int32_t budget = budget_;
  std::vector<int32_t> chunks(active.size(), 0);
  for (size_t k = 0; k < active.size() && budget > 0; ++k) {
    const int32_t n_hit = static_cast<int32_t>(hits[k].size());
    const int32_t begin = n_hit * bs;
    int32_t c = std::min(active[k]->n_tokens() - begin, budget);
    int32_t need = static_cast<int32_t>(blocks_for_tokens(begin + c, bs)) - n_hit;
    if (need > avail) {
      if (!alone) return false;
      c = std::max(0, avail) * bs;
      need = std::max(0, avail);
    }
    chunks[k] = c;
    avail -= need;
    budget -= c;
  }
  if (chunks[0] == 0) {
    if (alone) {
      // Its cached prefix alone fills every free block: no amount of waiting helps.
      fail(r, "the KV cache (" + std::to_string(mgr_.n_blocks()) + " blocks of " +
                  std::to_string(bs) + " tokens) cannot hold this request");
    }
    return false;
  }

  waiting_.pop_front();
  r->state = RequestState::kRunning;
  running_.push_back(r);
  running_seqs_ += r->n_live();
  for (size_t k = 0; k < active.size(); ++k) {
    Sequence& s = *active[k];
    s.n_computed = s.table.adopt_cached_prefix(mgr_, hits[k]);
    mgr_.record_lookup(s.n_tokens(), s.n_computed);
    if (!r->admitted_once && k == 0) r->n_cached_tokens = s.n_computed;
  }
  r->admitted_once = true;
  const int32_t leader_committed = active[0]->n_computed;
  for (size_t k = 0; k < active.size(); ++k) {
    if (chunks[k] > 0) emit(r, *active[k], chunks[k], !is_decode(*r, *active[k]));
  }
  if (r->has_parked()) maybe_unpark(r, leader_committed);
  return true;
}

void Scheduler::maybe_unpark(Request* r, int32_t leader_committed) {
  const int32_t bs = mgr_.block_size();
  const int32_t n_shared = r->prompt_len / bs;
  if (leader_committed < n_shared * bs) return;
  Sequence* leader = nullptr;
  for (Sequence& s : r->seqs) {
    if (!s.finished() && !s.parked) {
      leader = &s;
      break;
    }
  }
  PAGELLM_CHECK(leader != nullptr && leader->table.n_blocks() >= n_shared);
  std::vector<BlockId> hits;
  for (Sequence& s : r->seqs) {
    if (!s.parked) continue;
    // Blocks taken here are shared or revived from the cache: no new block is needed.
    s.table.share_prefix(mgr_, leader->table, n_shared);
    hits.clear();
    s.table.match_cached_prefix(mgr_, s.tokens, r->extra_hash, &hits);
    s.n_computed = s.table.adopt_cached_prefix(mgr_, hits);
    s.parked = false;
  }
}

void Scheduler::maybe_form_batch(double now_ms) {
  const BatchingPolicy& p = config_.batching;
  if (p.mode == BatchingMode::kContinuous || batch_open_ > 0 || waiting_.empty()) return;
  if (p.mode == BatchingMode::kDynamic &&
      static_cast<int32_t>(waiting_.size()) < p.batch_size &&
      now_ms - waiting_.front()->arrival_ms < p.max_wait_ms) {
    return;
  }
  ++current_batch_;
  for (Request* r : waiting_) {
    if (batch_open_ == p.batch_size) break;
    r->batch_id = current_batch_;
    ++batch_open_;
  }
}

SchedulePlan Scheduler::schedule(double now_ms) {
  PAGELLM_CHECK_MSG(in_flight_.empty(), "schedule() called while a step is in flight");
  SchedulePlan plan = std::move(spare_plan_);  // empty: recycle() cleared it
  spare_plan_ = SchedulePlan{};
  plan_ = &plan;
  entries_.clear();
  budget_ = config_.max_num_batched_tokens;

  // 1. Decodes, oldest request first. Preemption victims come from the back of running_, so the
  //    index stays valid; when r itself is preempted it was the last one and the loop ends.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Request* r = running_[i];
    for (Sequence& s : r->seqs) {
      if (budget_ == 0) break;
      if (!r->is_active(s) || !is_decode(*r, s)) continue;
      if (!schedule_running(r, s, 1)) break;
    }
  }
  // 2. Prefill chunks of running requests (prompts, or recomputation after preemption).
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Request* r = running_[i];
    for (Sequence& s : r->seqs) {
      if (budget_ == 0) break;
      if (!r->is_active(s) || is_decode(*r, s) || s.n_pending() == 0) continue;
      if (!schedule_running(r, s, std::min(s.n_pending(), budget_))) break;
    }
  }
  // 3. Admission, FCFS: the first request that does not fit stops it. None in a step that had to
  //    preempt: memory is short, and a victim re-admitted at once would only thrash.
  maybe_form_batch(now_ms);
  while (plan.preempted.empty() && !waiting_.empty() && budget_ > 0) {
    Request* r = waiting_.front();
    if (config_.batching.mode != BatchingMode::kContinuous &&
        (r->batch_id == 0 || r->batch_id != current_batch_)) {
      break;  // not a member of the open batch (batch ids start at 1; 0 is "none yet")
    }
    if (running_seqs_ + r->n_live() > config_.max_num_seqs) break;
    const size_t before = waiting_.size();
    if (!try_admit(r) && waiting_.size() == before) break;  // blocked (a failed one is dropped)
  }

  // 4. Guesses, with what is left: they never cost a running sequence or a waiting request
  //    its place.
  // Only when set_draft() gave drafts: a step without speculation walks no sequence for them.
  if (drafts_given_) {
    add_drafts();
    for (Request* r : running_)  // a draft serves one schedule() only; on_step_done checks the
      for (Sequence& s : r->seqs) s.draft.resize(s.n_draft_in_flight);  // verified ones
    drafts_given_ = false;
  }

  for (Entry& e : entries_) {
    InFlight f{e.seq.request_id, e.seq.seq_index, e.seq.needs_logits, e.seq.n_samples,
               e.seq.n_draft};
    in_flight_.push_back(f);
    plan.n_tokens += static_cast<int32_t>(e.seq.token_ids.size());
    plan.n_decode_seqs += e.seq.is_prefill ? 0 : 1;
    plan.copies.insert(plan.copies.end(), e.seq.copies.begin(), e.seq.copies.end());
    plan.seqs.push_back(std::move(e.seq));
  }
  entries_.clear();
  plan_ = nullptr;
  maybe_check();
  return plan;
}

bool Scheduler::next_is_decode(RequestId id, int32_t seq_index) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->state != RequestState::kRunning) return false;
  const Request& r = *it->second;
  if (seq_index < 0 || seq_index >= r.n) return false;
  const Sequence& s = r.seqs[seq_index];
  return r.is_active(s) && is_decode(r, s);
}

void Scheduler::set_draft(RequestId id, int32_t seq_index, std::span<const int32_t> draft) {
  if (!next_is_decode(id, seq_index)) return;
  requests_.at(id)->seqs[seq_index].draft.assign(draft.begin(), draft.end());
  drafts_given_ = true;
}

void Scheduler::add_drafts() {
  for (Entry& e : entries_) {
    if (budget_ <= 0) break;
    ScheduledSeq& q = e.seq;
    if (q.is_prefill || !q.needs_logits || q.n_samples != 1) continue;
    Request* r = e.req;
    Sequence& s = r->seqs[q.seq_index];
    if (s.draft.empty()) continue;
    // All guesses right gives them plus one more token: within max_tokens.
    const int32_t room = r->max_tokens - (s.n_tokens() - r->prompt_len) - 1;
    int32_t k = std::min({static_cast<int32_t>(s.draft.size()), room, budget_});
    if (k <= 0) continue;
    k = s.table.max_writable(mgr_, s.n_computed, k, mgr_.n_free());
    if (k <= 0) continue;
    s.table.prepare_write(mgr_, s.n_computed, s.n_computed + k, &q.copies);
    q.token_ids.insert(q.token_ids.end(), s.draft.begin(), s.draft.begin() + k);
    q.block_table = s.table.blocks();
    q.context_len += k;
    q.n_draft = k;
    s.n_draft_in_flight = k;
    budget_ -= k;
  }
}

void Scheduler::recycle(SchedulePlan&& plan) {
  // A prompt chunk's tokens (up to max_num_batched_tokens) are not kept: most sequences a step
  // are decodes of one token, and spares that each once held a long chunk would add up.
  constexpr size_t kKeptTokens = 256;
  for (ScheduledSeq& q : plan.seqs) {
    if (q.token_ids.capacity() > kKeptTokens) q.token_ids = {};
    spare_seqs_.push_back(std::move(q));
  }
  plan.seqs.clear();
  plan.copies.clear();
  plan.preempted.clear();
  plan.failed.clear();
  plan.n_tokens = 0;
  plan.n_decode_seqs = 0;
  spare_plan_ = std::move(plan);
}

// ---------------------------------------------------------------------------------------------
// Step results

std::vector<FinishedRequest> Scheduler::on_step_done(std::span<const SampledToken> results) {
  // The results by (request, sequence), for lookups: one sort of their indices into a buffer
  // that keeps its capacity, where a map of vectors had cost a few allocations per sequence each
  // step (docs/perf-history, twenty-first round).
  by_sequence_.resize(results.size());
  for (size_t i = 0; i < results.size(); ++i) by_sequence_[i] = static_cast<uint32_t>(i);
  const auto key = [&](uint32_t i) {
    return std::pair(results[i].request_id, results[i].seq_index);
  };
  // Stable: a sequence that verified a draft reports several tokens, kept in their order.
  std::stable_sort(by_sequence_.begin(), by_sequence_.end(),
                   [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
  // A sequence's results, in the order reported.
  auto range = [&](RequestId id, int32_t seq_index) {
    const auto k = std::pair(id, seq_index);
    auto first = std::lower_bound(by_sequence_.begin(), by_sequence_.end(), k,
                                  [&](uint32_t i, const auto& v) { return key(i) < v; });
    auto last = first;
    while (last != by_sequence_.end() && key(*last) == k) ++last;
    return std::pair(first, last);
  };
  auto take = [&](RequestId id, int32_t seq_index) -> const SampledToken* {
    const auto [first, last] = range(id, seq_index);
    return first != last ? &results[*first] : nullptr;
  };

  // The requests that sampled, in plan order; a request's sequences are consecutive there, so
  // skipping a repeat of the last id keeps each once (a repeat further on would only be skipped
  // below: the request is finished and forgotten, or still live, at its first visit).
  std::vector<RequestId> touched;
  auto append = [&](Request* r, Sequence& s, const SampledToken& t) {
    s.tokens.push_back(t.token);
    FinishReason reason = t.finish;
    if (reason == FinishReason::kNone && s.n_tokens() - r->prompt_len >= r->max_tokens) {
      reason = FinishReason::kLength;
    }
    if (reason != FinishReason::kNone) end_sequence(s, reason);
  };

  for (const InFlight& f : in_flight_) {
    auto it = requests_.find(f.id);
    if (it == requests_.end()) continue;  // aborted while the step ran
    Request* r = it->second.get();
    // Aborted while the step ran, and its id already reused by a new (waiting) request.
    if (r->state != RequestState::kRunning) continue;
    Sequence& s = r->seqs[f.seq_index];
    if (s.finished()) continue;  // stopped by resolve_tokens() after this step was planned
    // The step wrote this sequence's KV: its full blocks become findable.
    s.table.register_computed(mgr_, s.tokens, s.n_computed, r->extra_hash);
    if (r->has_parked()) maybe_unpark(r, s.n_computed);  // s is the leader: the only one active
    if (!f.needs_logits) continue;
    if (touched.empty() || touched.back() != r->id) touched.push_back(r->id);
    if (!r->forked) {
      // First sample of the prompt: n tokens from one row; sequence j gets sample j and a table
      // sharing all of sequence 0's blocks (the partial last block is copied on first write).
      PAGELLM_CHECK(f.seq_index == 0 && f.n_samples == r->n);
      std::vector<const SampledToken*> samples(r->n);
      for (int32_t j = 0; j < r->n; ++j) {
        samples[j] = take(r->id, j);
        PAGELLM_CHECK_MSG(samples[j] != nullptr, "on_step_done: a sample is missing");
      }
      for (int32_t j = 1; j < r->n; ++j) {
        Sequence& sj = r->seqs[j];
        PAGELLM_CHECK(sj.table.empty());
        sj.table = s.table.fork(mgr_);
        sj.n_computed = s.n_computed;
      }
      r->forked = true;
      for (int32_t j = 0; j < r->n; ++j) append(r, r->seqs[j], *samples[j]);
    } else if (f.n_draft > 0) {
      // The guesses that were right, then the model's next token: the KV of the first ones is
      // the sequence's, the rest of the step's speculative KV goes.
      const auto [first, last] = range(r->id, f.seq_index);
      const int32_t n = static_cast<int32_t>(last - first);
      PAGELLM_CHECK_MSG(n >= 1, "on_step_done: a sampled token is missing");
      PAGELLM_CHECK_MSG(n <= f.n_draft + 1, "on_step_done: more tokens than a draft allows");
      s.n_draft_in_flight = 0;
      for (int32_t i = 0; i < n && !s.finished(); ++i) {
        const SampledToken& t = results[first[i]];
        PAGELLM_CHECK_MSG(i + 1 == n || t.token == s.draft[i],
                          "on_step_done: a token before the last is not the guess it verified");
        append(r, s, t);
        if (i + 1 < n && !s.finished()) ++s.n_computed;  // a right guess: its KV is computed
      }
      s.draft.clear();
      if (!s.finished()) {
        s.table.truncate(mgr_, s.n_computed);
        s.table.register_computed(mgr_, s.tokens, s.n_computed, r->extra_hash);
      }
    } else {
      const SampledToken* t = take(r->id, f.seq_index);
      PAGELLM_CHECK_MSG(t != nullptr, "on_step_done: a sampled token is missing");
      append(r, s, *t);
    }
  }
  in_flight_.clear();

  std::vector<FinishedRequest> done;
  for (RequestId id : touched) {
    auto found = requests_.find(id);
    if (found == requests_.end()) continue;
    Request* r = found->second.get();
    if (r->state != RequestState::kRunning || r->n_live() > 0) continue;
    done.push_back(complete(r));
  }
  maybe_check();
  return done;
}

void Scheduler::end_sequence(Sequence& s, FinishReason reason) {
  s.finish = reason;
  s.table.release(mgr_);
  s.n_computed = 0;
  --running_seqs_;
}

FinishedRequest Scheduler::complete(Request* r) {
  remove_running(r);  // no live sequence left to uncount: each was as it ended
  r->state = RequestState::kFinished;
  FinishedRequest info = summarize(*r);
  forget(r);
  return info;
}

bool Scheduler::can_plan_ahead() const {
  int32_t in_step = 0, blocks = 0;
  for (const InFlight& f : in_flight_) {
    const auto it = requests_.find(f.id);
    if (it == requests_.end() || it->second->state != RequestState::kRunning) continue;
    const Request& r = *it->second;
    const Sequence& s = r.seqs[f.seq_index];
    if (!f.needs_logits || (!r.forked && r.n > 1) || r.has_parked() || f.n_draft > 0) return false;
    ++in_step;
    // The next decode writes position n_computed (the token this step samples).
    blocks += s.table.n_blocks_needed(mgr_, s.n_computed, s.n_computed + 1);
  }
  int32_t active = 0;
  for (const Request* r : running_) {
    for (const Sequence& s : r->seqs) active += r->is_active(s) ? 1 : 0;
  }
  return in_step > 0 && in_step == active && blocks <= mgr_.n_free();
}

std::vector<FinishedRequest> Scheduler::resolve_tokens(std::span<const SampledToken> results) {
  std::vector<FinishedRequest> done;
  for (const SampledToken& t : results) {
    auto it = requests_.find(t.request_id);
    if (it == requests_.end()) continue;  // aborted, or finished at max_tokens
    Request* r = it->second.get();
    if (is_terminal(r->state) || t.seq_index < 0 || t.seq_index >= r->n) continue;
    Sequence& s = r->seqs[t.seq_index];
    if (s.finished()) continue;
    PAGELLM_CHECK_MSG(!s.tokens.empty() && s.tokens.back() == kPendingToken,
                      "resolve_tokens: the sequence has no pending token");
    PAGELLM_CHECK_MSG(t.token >= 0, "resolve_tokens: a pending token's value is missing");
    s.tokens.back() = t.token;
    if (t.finish == FinishReason::kNone) continue;
    // Planning ahead preempts nothing (can_plan_ahead), so a live sequence is still running.
    PAGELLM_CHECK_MSG(r->state == RequestState::kRunning,
                      "resolve_tokens: a stopped sequence is not running");
    end_sequence(s, t.finish);
    if (r->n_live() == 0) done.push_back(complete(r));
  }
  maybe_check();
  return done;
}

// ---------------------------------------------------------------------------------------------
// Introspection

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.n_waiting = n_waiting();
  s.n_running = n_running();
  s.n_running_seqs = running_seqs_;
  s.n_preemptions = n_preemptions_;
  s.kv_usage = mgr_.usage();
  s.prefix = mgr_.prefix_stats();
  return s;
}

Status Scheduler::check_invariants() const {
  PAGELLM_RETURN_IF_ERROR(mgr_.check_invariants());
  const int32_t bs = mgr_.block_size();
  std::vector<int32_t> refs(mgr_.n_blocks(), 0);
  auto where = [](const Request* r) { return "sched: request " + std::to_string(r->id) + ": "; };

  int32_t seqs = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Request* r = running_[i];
    if (r->state != RequestState::kRunning) return internal_error(where(r) + "in running_ but not running");
    if (i > 0 && running_[i - 1]->arrival_seq >= r->arrival_seq) {
      return internal_error(where(r) + "running requests out of arrival order");
    }
    seqs += r->n_live();
    for (const Sequence& s : r->seqs) {
      if (!r->is_active(s)) {
        if (!s.table.empty()) return internal_error(where(r) + "inactive sequence holds blocks");
        continue;
      }
      if (s.n_computed < 0 || s.n_computed > s.n_tokens()) {
        return internal_error(where(r) + "n_computed out of range");
      }
      // Guesses in flight hold the blocks of their positions past the computed tokens.
      if (s.table.n_blocks() != blocks_for_tokens(s.n_computed + s.n_draft_in_flight, bs)) {
        return internal_error(where(r) + "sequence " + std::to_string(s.index) + " holds " +
                              std::to_string(s.table.n_blocks()) + " blocks for " +
                              std::to_string(s.n_computed) + " computed tokens and " +
                              std::to_string(s.n_draft_in_flight) + " guesses");
      }
      for (BlockId b : s.table.blocks()) ++refs[b];
    }
  }
  if (seqs != running_seqs_) return internal_error("sched: running sequence count is off");
  if (running_seqs_ > config_.max_num_seqs) return internal_error("sched: max_num_seqs exceeded");
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Request* r = waiting_[i];
    if (r->state != RequestState::kWaiting && r->state != RequestState::kPreempted) {
      return internal_error(where(r) + "in the waiting queue in state " +
                            request_state_name(r->state));
    }
    if (i > 0 && waiting_[i - 1]->arrival_seq >= r->arrival_seq) {
      return internal_error(where(r) + "waiting queue out of arrival order");
    }
    for (const Sequence& s : r->seqs) {
      if (!s.table.empty() || s.n_computed != 0) {
        return internal_error(where(r) + "waiting request holds blocks");
      }
    }
  }
  if (!running_.empty() && !waiting_.empty() &&
      running_.back()->arrival_seq > waiting_.front()->arrival_seq) {
    return internal_error("sched: FCFS broken: request " + std::to_string(running_.back()->id) +
                          " runs while older request " + std::to_string(waiting_.front()->id) +
                          " waits");
  }
  if (requests_.size() != running_.size() + waiting_.size()) {
    return internal_error("sched: requests are neither running nor waiting");
  }
  for (BlockId b = 0; b < mgr_.n_blocks(); ++b) {
    if (refs[b] != mgr_.ref_count(b)) {
      return internal_error("sched: block " + std::to_string(b) + " has refcount " +
                            std::to_string(mgr_.ref_count(b)) + " but " + std::to_string(refs[b]) +
                            " tables hold it");
    }
  }
  return {};
}

void Scheduler::maybe_check() const {
  if (!config_.paranoid) return;
  Status st = check_invariants();
  PAGELLM_CHECK_MSG(st.ok(), st.message().c_str());
}

}  // namespace pagellm
