// The guesses of a proposer that runs a model (a draft model, an MTP module): the next token after
// each row of its logits. For a request that decodes greedily, the row's argmax (on the device
// when the backend samples there and no row of the batch draws); for a request that samples, a
// draw from the row's distribution processed with the request's settings as the target's row is,
// at the draft stream's uniform for the guess's position, with the distribution handed over for
// the rejection sampler (sample/rejection_sampler.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/device_sample.h"
#include "model/logits_head.h"
#include "sample/sampler.h"
#include "spec/proposer.h"

namespace pagellm {

// One row of the proposer's logits.
struct DraftRow {
  const ProposalRequest* p = nullptr;
  // A sampled request's history at this guess: its outputs, then the guesses before this one.
  const std::vector<int32_t>* history = nullptr;
};

// Appends `token` to p's draft, and to `history` when p samples; whether p wants another guess.
bool add_guess(const ProposalRequest& p, std::vector<int32_t>& history, int32_t token);

class DraftPicker {
 public:
  DraftPicker(Backend& backend, const SamplerConfig& sampler);
  //   logits act [rows.size(), vocab] on the backend's device. next[i] becomes row i's guess, or
  //   -1 for none (a non-finite row); a drawn guess's distribution is appended to its request's
  //   draft_probs.
  void pick(const Tensor& logits, std::span<const DraftRow> rows, std::vector<int32_t>& next);

 private:
  Backend& backend_;
  Sampler sampler_;
  int64_t vocab_;
  std::vector<float> host_logits_;
  std::vector<DeviceSampleRow> device_rows_;
  std::vector<DeviceSampleResult> results_;
  LogitsDownload download_{backend_};
};

}  // namespace pagellm
