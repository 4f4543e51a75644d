// Packing a sampling step for a device backend (Backend::sample, backend/device_sample.h), and
// turning its results back into the CPU Sampler's outputs, so the engine can sample on either
// device through one interface and get the same tokens, logprobs and row errors.
//
// Per row the pack holds the scalar parameters and a sparse edit list: one entry per distinct
// token that logit_bias, min_tokens suppression or the penalties touch, with everything needed to
// recompute that token's processed logit from its raw one exactly as apply_logit_bias,
// suppress_tokens and apply_penalties do (sample/logits_processors.h): its bias, whether it is
// suppressed, whether it occurs in prompt ∪ output (repetition) and its output count (presence /
// frequency). The entries are sorted by token. The grammar rows' allowed-token masks form the
// batch's mask list: where they already lie back to back in one buffer, in row order (the
// engine makes them so), the list is that buffer, else they are copied. Host-side problems (a
// token outside the
// vocabulary) mark the row kSampleSkip and keep the CPU Sampler's error for it; the device still
// checks the row's logits, whose error takes precedence, as on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/device_sample.h"
#include "core/status.h"
#include "sample/sampler.h"

namespace pagellm {

struct PackedSampleBatch {
  std::vector<DeviceSampleRow> rows;
  std::vector<DeviceSampleEdit> edits;
  // The grammar rows' allowed-token masks (SampleRow::allowed), back to back: mask_store, or the
  // rows' own buffer when their masks lay so already (valid while that buffer is: the call that
  // sends the batch reads it, nothing later does).
  std::span<const uint32_t> masks;
  std::vector<uint32_t> mask_store;
  std::vector<Status> host_status;  // per row: the error found while packing (kSampleSkip rows)

  // The call Backend::sample takes, pointing into these vectors.
  DeviceSampleInputs inputs() const {
    return {rows.data(),  static_cast<int32_t>(rows.size()),
            edits.data(), static_cast<int32_t>(edits.size()),
            masks.data(), static_cast<int64_t>(masks.size())};
  }
};

class SampleBatchPacker {
 public:
  // config: the vocabulary size and the model's EOS ids, as for the CPU Sampler.
  explicit SampleBatchPacker(const SamplerConfig& config);

  // Packs rows[i] to sample logits row logits_rows[i] (n > 1 samples may share a row). `out` is
  // overwritten; its vectors keep their capacity from step to step. Rows are packed in parallel
  // on the config's pool from config.min_rows_for_parallel rows up.
  void pack(std::span<const SampleRow> rows, std::span<const int64_t> logits_rows,
            PackedSampleBatch& out);

  // The device's results for `batch` (one per packed row) as the CPU Sampler would have reported
  // them: token, logprob / rank / top list when asked, and the same Status codes and messages.
  static void unpack(const PackedSampleBatch& batch, std::span<const DeviceSampleResult> results,
                     std::span<SampleOutput> out);

 private:
  // One row's params and history -> its DeviceSampleRow (edit range left 0) and sorted edits.
  Status pack_row(int64_t r, const SampleRow& row, DeviceSampleRow& d,
                  std::vector<DeviceSampleEdit>& edits) const;

  SamplerConfig config_;
  std::vector<std::vector<DeviceSampleEdit>> row_edits_;  // per row, reused across steps
};

}  // namespace pagellm
