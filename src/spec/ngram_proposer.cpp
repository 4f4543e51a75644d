#include "spec/ngram_proposer.h"

#include <algorithm>

#include "core/check.h"

namespace pagellm {

NgramProposer::NgramProposer(const NgramConfig& config) : config_(config) {
  PAGELLM_CHECK_MSG(config_.min_n >= 1 && config_.min_n <= config_.max_n,
                    "n-gram proposer: need 1 <= min_n <= max_n");
}

void NgramProposer::propose(std::span<const ProposalRequest> batch) {
  for (const ProposalRequest& r : batch) propose_one(r.tokens, r.max_tokens, config_, *r.draft);
}

void NgramProposer::propose_one(std::span<const int32_t> tokens, int32_t max_tokens,
                                const NgramConfig& config, std::vector<int32_t>& draft) {
  draft.clear();
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(config.max_n, len - 1); n >= config.min_n; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // Earlier occurrences end at e < len (the suffix's own end): the most recent first. Its
    // last token is compared first, the cheap test that rejects almost every position.
    for (int64_t e = len - 2; e >= n - 1; --e) {
      if (tokens[e] != suffix[n - 1]) continue;
      if (!std::equal(suffix, suffix + n - 1, tokens.data() + e - n + 1)) continue;
      // What followed, up to max_tokens; where that runs past the end of the text it goes on
      // from the guesses themselves: a text that repeats with a short period (a list, a table
      // row, a token over and over) gets whole drafts, not just up to its end.
      for (int64_t j = e + 1; static_cast<int64_t>(draft.size()) < max_tokens; ++j)
        draft.push_back(j < len ? tokens[j] : draft[j - len]);
      return;
    }
  }
}

}  // namespace pagellm
