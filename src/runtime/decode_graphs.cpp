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

void DecodeGraphs::size_builder() {
  // One build at the largest bucket grows the builder's buffer once and for all, so the addresses
  // of every bucket's layout stay put.
  if (sized_) return;
  builder_.build_padded({}, buckets_.back(), table_width_, max_model_len_);
  sized_ = true;
}

Tensor DecodeGraphs::run_and_record(int32_t bucket, const StepBatch& batch) {
  // Running the step directly first sizes every buffer it needs, so the recording allocates
  // nothing; the direct run's results are this step's.
  model_.compute(batch, cache_);
  const Tensor logits = model_.last_logits();
  Recording& rec = recordings_[bucket];
  rec.epoch = backend_.allocation_epoch();
  rec.graph = backend_.capture([&] { model_.compute(batch, cache_); });
  rec.logits = model_.last_logits();
  ++n_recorded_;
  if (!rec.graph) {
    rec.unrecordable = true;
    PAGELLM_LOG_WARN("decode graph for batch %d could not be recorded; running ops directly", bucket);
  } else if (backend_.allocation_epoch() != rec.epoch) {
    rec.graph.reset();  // the recording itself moved memory: not safe to replay
  }
  return logits;
}

Tensor DecodeGraphs::run(const std::vector<SeqChunk>& seqs) {
  PAGELLM_CHECK(accepts(seqs));
  size_builder();
  const int32_t n = static_cast<int32_t>(seqs.size());
  const int32_t bucket = bucket_for(n);
  const StepBatch& batch = builder_.build_padded(seqs, bucket, table_width_, max_model_len_);
  model_.prepare(batch);  // may regrow scratch, which moves the epoch: check after it
  auto it = recordings_.find(bucket);
  if (it != recordings_.end() && it->second.unrecordable) {
    model_.compute(batch, cache_);
    return model_.last_logits().slice_rows(0, n);
  }
  if (it != recordings_.end() && it->second.graph &&
      it->second.epoch == backend_.allocation_epoch()) {
    it->second.graph->replay();
    return it->second.logits.slice_rows(0, n);
  }
  return run_and_record(bucket, batch).slice_rows(0, n);
}

void DecodeGraphs::warm_up() {
  size_builder();
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
    const StepBatch& batch = builder_.build_padded({}, *it, table_width_, max_model_len_);
    model_.prepare(batch);
    run_and_record(*it, batch);
  }
  // A smaller bucket can still have regrown a workspace (more attention splits at small batch):
  // drop what that made stale; it is recorded again on first use.
  for (auto& [b, rec] : recordings_) {
    if (rec.epoch != backend_.allocation_epoch()) rec.graph.reset();
  }
  backend_.synchronize();
}

}  // namespace pagellm
