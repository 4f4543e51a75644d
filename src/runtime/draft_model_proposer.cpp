#include "runtime/draft_model_proposer.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"

namespace pagellm {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxChunk = 512;

}  // namespace

DraftModelProposer::DraftModelProposer(Model& draft, Backend& backend, int32_t max_len,
                                       int32_t max_runners)
    : draft_(draft), backend_(backend), max_len_(max_len), max_runners_(max_runners) {}

int64_t DraftModelProposer::runner_cache_bytes(const Model& draft, const Backend& backend,
                                               int32_t max_len) {
  const int64_t blocks = (max_len + kBlockSize - 1) / kBlockSize;
  return blocks * KvCache::bytes_per_block(draft.kv_spec(), kBlockSize, backend.activation_dtype());
}

DraftModelProposer::Runner& DraftModelProposer::runner_for(uint64_t request_id, int32_t seq_index) {
  const auto key = std::pair(request_id, seq_index);
  auto it = live_.find(key);
  if (it != live_.end()) return it->second;
  Runner r;
  if (!spare_.empty()) {
    r = std::move(spare_.back());
    spare_.pop_back();
    r.runner->reset();
    r.fed.clear();
  } else {
    // Eager steps: a runner's recorded graphs would cost their memory once per sequence.
    r.runner = std::make_unique<SequenceRunner>(draft_, backend_, max_len_, kBlockSize, kMaxChunk,
                                                /*use_graphs=*/false);
  }
  return live_.emplace(key, std::move(r)).first->second;
}

int32_t DraftModelProposer::next_token(Runner& r, std::span<const int32_t> tokens) {
  r.fed.insert(r.fed.end(), tokens.begin(), tokens.end());
  if (backend_.supports_sampling()) {
    auto logits = r.runner->feed_on_device(tokens);
    if (!logits.ok()) return -1;
    DeviceSampleRow row;
    row.flags = kSampleGreedy;
    DeviceSampleResult res;
    backend_.sample(*logits, {&row, 1}, &res);
    return res.status == DeviceSampleStatus::kOk ? res.token : -1;
  }
  auto logits = r.runner->feed(tokens, LogitsWanted::kLast);
  if (!logits.ok()) return -1;
  // The argmax, lowest id on ties; a row with a NaN guesses nothing.
  int32_t best = -1;
  for (size_t t = 0; t < logits->size(); ++t) {
    const float x = (*logits)[t];
    if (x != x) return -1;
    if (best < 0 || x > (*logits)[best]) best = static_cast<int32_t>(t);
  }
  return best;
}

void DraftModelProposer::propose(std::span<const ProposalRequest> batch) {
  for (const ProposalRequest& p : batch) {
    std::vector<int32_t>& draft = *p.draft;
    draft.clear();
    if (p.tokens.empty() || p.max_tokens <= 0) continue;
    Runner& r = runner_for(p.request_id, p.seq_index);
    // What the runner holds that is still the sequence's (its guesses that were wrong go), less
    // the last token at least: the guesses start from that token's logits.
    const size_t same = static_cast<size_t>(
        std::mismatch(r.fed.begin(), r.fed.end(), p.tokens.begin(), p.tokens.end()).first -
        r.fed.begin());
    const size_t keep = std::min(same, p.tokens.size() - 1);
    r.runner->truncate(static_cast<int32_t>(keep));
    r.fed.resize(keep);
    int32_t t = next_token(r, p.tokens.subspan(keep));
    while (t >= 0) {
      draft.push_back(t);
      if (static_cast<int32_t>(draft.size()) == p.max_tokens) break;
      const int32_t last = t;
      t = next_token(r, std::span<const int32_t>(&last, 1));
    }
  }
}

void DraftModelProposer::release(uint64_t request_id) {
  auto it = live_.lower_bound(std::pair(request_id, INT32_MIN));
  while (it != live_.end() && it->first.first == request_id) {
    if (static_cast<int32_t>(spare_.size()) < max_runners_) spare_.push_back(std::move(it->second));
    it = live_.erase(it);
  }
}

}  // namespace pagellm
