#include "runtime/decode_graphs.h"

#include <algorithm>

#include "core/log.h"

namespace pagellm {

std::unique_ptr<DecodeGraphs> DecodeGraphs::create(Model& model, Backend& backend, KvCache& cache,
                                                   int32_t block_size, int32_t max_seqs,
                                                   int32_t max_model_len) {
  if (max_seqs < 1 || max_model_len < 1) return nullptr;
  // Probe: a backend without recording returns null for any capture.
  if (!backend.capture([] {})) return nullptr;
  return std::unique_ptr<DecodeGraphs>(
      new DecodeGraphs(model, backend, cache, block_size, max_seqs, max_model_len));
}

DecodeGraphs::DecodeGraphs(Model& model, Backend& backend, KvCache& cache, int32_t block_size,
                           int32_t max_seqs, int32_t max_model_len)
    : model_(model),
      backend_(backend),
      cache_(cache),
      table_width_((max_model_len + block_size - 1) / block_size),
      max_model_len_(max_model_len),
      builder_(backend, block_size) {
  // Small batches get their own sizes (padding a batch of 3 to 8 would read 8 rows of every
  // activation); above 8, steps of 8 keep the count of recordings small.
  for (int32_t b : {1, 2, 4}) {
    if (b < max_seqs) buckets_.push_back(b);
  }
  for (int32_t b = 8; b < max_seqs; b += 8) buckets_.push_back(b);
  buckets_.push_back(max_seqs);
  // Context tiers. The decode kernel's scratch grows with the bound it is planned for (a partial
  // result per 1,024 keys of it), and its grid a little (a block walks up to 8 of those pieces):
  // 512 contexts of 640 tokens take 360 us a layer planned for 8,192, 401 for 131,072
  // (docs/perf-history "Seventeenth round"), and the 131,072 plan's scratch is 1.1 GB. So 8,192,
  // then four times as many each: a server of 131,072 tokens records three sets (8,192, 32,768,
  // 131,072).
  constexpr int32_t kFirstTier = 8192, kTierStep = 4;
  for (int64_t t = kFirstTier; t < max_model_len; t *= kTierStep)
    tiers_.push_back(static_cast<int32_t>(t));
  tiers_.push_back(max_model_len);
}

bool DecodeGraphs::accepts(const std::vector<SeqChunk>& seqs) const {
  if (seqs.empty() || static_cast<int32_t>(seqs.size()) > buckets_.back()) return false;
  return std::all_of(seqs.begin(), seqs.end(), [&](const SeqChunk& c) {
    return c.n_tokens == 1 && c.logits == LogitsWanted::kLast && c.n_blocks <= table_width_ &&
           c.start_pos < max_model_len_;
  });
}

int32_t DecodeGraphs::bucket_for(int32_t n) const {
  return *std::lower_bound(buckets_.begin(), buckets_.end(), n);
}

int32_t DecodeGraphs::tier_for(const std::vector<SeqChunk>& seqs) const {
  int32_t longest = 1;  // the context the step's attention reads, its new token included
  for (const SeqChunk& c : seqs) longest = std::max(longest, c.start_pos + 1);
  return *std::lower_bound(tiers_.begin(), tiers_.end(), longest);
}

void DecodeGraphs::size_builder() {
  // One build at the largest bucket grows the builder's buffer once and for all, so the addresses
  // of every bucket's layout stay put.
  if (sized_) return;
  builder_.build_padded({}, buckets_.back(), table_width_, max_model_len_);
  sized_ = true;
}

Tensor DecodeGraphs::run_and_record(Key key, const StepBatch& batch) {
  // Running the step directly first sizes every buffer it needs, so the recording allocates
  // nothing; the direct run's results are this step's.
  model_.compute(batch, cache_);
  const Tensor logits = model_.last_logits();
  Recording& rec = recordings_[key];
  rec.epoch = backend_.allocation_epoch();
  rec.graph = backend_.capture([&] { model_.compute(batch, cache_); });
  rec.logits = model_.last_logits();
  ++n_recorded_;
  if (!rec.graph) {
    rec.unrecordable = true;
    PAGELLM_LOG_WARN(
        "decode graph for batch %d, contexts up to %d, could not be recorded; running "
        "ops directly",
        key.first, key.second);
  } else if (backend_.allocation_epoch() != rec.epoch) {
    rec.graph.reset();  // the recording itself moved memory: not safe to replay
  }
  return logits;
}

Tensor DecodeGraphs::run(const std::vector<SeqChunk>& seqs, uint64_t sampled_ticket) {
  PAGELLM_CHECK(accepts(seqs));
  size_builder();
  const int32_t n = static_cast<int32_t>(seqs.size());
  const Key key{bucket_for(n), tier_for(seqs)};
  const StepBatch& batch =
      builder_.build_padded(seqs, key.first, table_width_, key.second, sampled_ticket);
  model_.prepare(batch);  // may regrow scratch, which moves the epoch: check after it
  auto it = recordings_.find(key);
  if (it != recordings_.end() && it->second.unrecordable) {
    model_.compute(batch, cache_);
    return model_.last_logits().slice_rows(0, n);
  }
  if (it != recordings_.end() && it->second.graph &&
      it->second.epoch == backend_.allocation_epoch()) {
    it->second.graph->replay();
    return it->second.logits.slice_rows(0, n);
  }
  return run_and_record(key, batch).slice_rows(0, n);
}

void DecodeGraphs::warm_up() {
  size_builder();
  // The longest tier and the largest bucket first: they size the workspaces for the rest.
  for (auto tier = tiers_.rbegin(); tier != tiers_.rend(); ++tier) {
    for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
      const StepBatch& batch = builder_.build_padded({}, *it, table_width_, *tier);
      model_.prepare(batch);
      run_and_record({*it, *tier}, batch);
    }
  }
  // A smaller bucket can still have regrown a workspace (more attention splits at small batch):
  // drop what that made stale; it is recorded again on first use.
  for (auto& [key, rec] : recordings_) {
    if (rec.epoch != backend_.allocation_epoch()) rec.graph.reset();
  }
  backend_.synchronize();
}

}  // namespace pagellm
