// DecodeGraphs: decode steps (one new token per sequence) replayed from recorded graphs instead of
// launched op by op. A decode step of a dense 8B model is ~330 kernel launches whose host cost is
// as long as their device time at small batch; a replay is one launch, and the next step's host
// work overlaps the device's.
//
// A graph bakes in every device address and launch shape, so the runner keeps them fixed:
// - batches are padded to a bucket size (1, 2, 4, 8, then multiples of 8 up to max_seqs), laid
//   out by a builder of its own at fixed offsets with block tables max_model_len wide
//   (StepBatchBuilder::build_padded);
// - attention is planned for a bound on the batch's contexts, one of a few context tiers (8,192
//   tokens, then four times as many each, up to max_model_len): each (bucket, tier) is a
//   recording of its own, and a step takes the smallest tier that holds its longest context (the
//   decode kernel cuts each sequence's real context on the device, but its grid and scratch grow
//   with the bound: planned for 131,072, 512 short contexts took twice the attention time they
//   take planned for 8,192, docs/perf-history "Tenth round");
// - the model's scratch and the backend's workspaces must not move: a bucket is recorded right
//   after the same batch ran directly (which sizes them), and every recording is dropped when the
//   backend's allocation epoch moves (some buffer was freed or regrown), to be recorded again on
//   its next use.
// Per step only the host-side tables are uploaded (batch metadata, the RoPE rows), then the
// graph replays. Not used when the backend cannot record (CPU).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "model/model.h"
#include "runtime/step_batch.h"

namespace pagellm {

class DecodeGraphs {
 public:
  // Null when graphs are not possible for this model on this backend. `cache` must outlive the
  // runner; max_seqs bounds the decode batch, max_model_len every sequence's context.
  static std::unique_ptr<DecodeGraphs> create(Model& model, Backend& backend, KvCache& cache,
                                              int32_t block_size, int32_t max_seqs,
                                              int32_t max_model_len);

  // True when `seqs` is a decode step this runner takes: every chunk one token wanting its
  // logits, no more sequences than the largest bucket.
  bool accepts(const std::vector<SeqChunk>& seqs) const;

  // Runs an accepted step; returns its logits on the device, rows [0, seqs.size()) in order
  // (act [seqs.size(), vocab]), valid until the next step. With a sampling ticket, negative
  // token ids are that call's sampled tokens (Backend::take_sampled_tokens).
  Tensor run(const std::vector<SeqChunk>& seqs, uint64_t sampled_ticket = 0);

  // Records every bucket now, largest first, with padding-only batches (nothing is stored), so the
  // first real step of any size replays at once.
  void warm_up();

  const std::vector<int32_t>& buckets() const { return buckets_; }
  const std::vector<int32_t>& tiers() const { return tiers_; }  // ascending; the last max_model_len
  int64_t n_recorded() const { return n_recorded_; }  // recordings made so far (re-recordings too)

 private:
  DecodeGraphs(Model& model, Backend& backend, KvCache& cache, int32_t block_size,
               int32_t max_seqs, int32_t max_model_len);

  struct Recording {
    std::unique_ptr<OpGraph> graph;
    Tensor logits;  // act [bucket, vocab]: where the replay leaves them
    uint64_t epoch = 0;
    bool unrecordable = false;  // the backend refused to record it: always run directly
  };

  using Key = std::pair<int32_t, int32_t>;  // (batch bucket, context tier)

  int32_t bucket_for(int32_t n) const;
  int32_t tier_for(const std::vector<SeqChunk>& seqs) const;
  void size_builder();
  Tensor run_and_record(Key key, const StepBatch& batch);

  Model& model_;
  Backend& backend_;
  KvCache& cache_;
  int32_t table_width_;
  int32_t max_model_len_;
  std::vector<int32_t> buckets_;
  std::vector<int32_t> tiers_;
  StepBatchBuilder builder_;
  std::map<Key, Recording> recordings_;
  bool sized_ = false;  // the builder's buffer has been grown for the largest bucket
  int64_t n_recorded_ = 0;
};

}  // namespace pagellm
