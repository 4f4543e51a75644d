// The sampler's building blocks on one row of logits ([vocab] f32), exposed so that each can be
// tested against a direct computation and mirrored by the CUDA version. Sampler (sampler.h) chains
// them in a fixed order; the exact semantics of each step are stated here.
//
// Token order. Where "the k best" or "the most likely" tokens are meant, tokens are ranked by
// logit, higher first, and ties go to the lower token id. This total order makes top-k exact
// (exactly k tokens, never more on ties) and every result deterministic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "sample/sampling_params.h"

namespace pagellm {

struct TokenLogit {
  float logit;
  int32_t token;
};
// The token order above: a before b.
inline bool ranks_before(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

struct TokenProb {
  int32_t token;
  double prob;
};

// Buffers reused across rows so the hot loop does not allocate. One per thread; never shared.
struct SampleScratch {
  std::vector<float> weights;           // [vocab] exp((logit - max) / T)
  std::vector<TokenLogit> candidates;   // top-k / top-p candidates
  std::vector<TokenLogit> border;       // top-p candidates; top-k: (s, token) pairs
  std::vector<TokenLogit> kept_candidates;  // top-p: the bucket where the mass crosses top_p
  std::vector<int32_t> kept;            // kept token ids, ascending
  std::vector<float> kept_weights;      // their w, same order
  std::vector<double> bucket_mass;      // top-p histogram
  std::vector<double> block_mass;       // kept mass per block of tokens, for the draw
  // Penalties: per-token occurrence counts, valid where stamp[token] == epoch (no clearing of
  // the vocab-sized arrays between rows).
  std::vector<uint32_t> stamp;
  std::vector<uint32_t> count;
  std::vector<int32_t> touched;
  uint32_t epoch = 0;
};

// OK when the row has at least one finite logit and no NaN or +inf (-inf is a mask and allowed);
// otherwise an error naming `row` and the first bad token.
Status check_logits_row(std::span<const float> logits, int64_t row);

// logits[t] += bias for each entry. Error (naming the token) if a token is outside the row.
Status apply_logit_bias(std::span<float> logits, std::span<const LogitBias> bias);

// logits[t] = -inf for each listed token (min_tokens: EOS and stop ids cannot be sampled yet).
Status suppress_tokens(std::span<float> logits, std::span<const int32_t> tokens);

// Words of a token bitmask over `vocab_size` tokens: bit t % 32 of word t / 32 is token t.
inline int64_t token_mask_words(int64_t vocab_size) {
  return (vocab_size + 31) / 32;
}

// logits[t] = -inf for every token whose bit in `allowed` is clear (a grammar's next-token mask,
// runtime/grammar.h). Error if the mask has fewer words than the row needs.
Status apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed);

// Penalties from the token history, in this order (vLLM's):
//   1. repetition (HF): for each distinct token in prompt ∪ output, logit = logit / r if
//      logit > 0, else logit * r. The result is clamped to +-FLT_MAX so a tiny r cannot make inf.
//   2. frequency and presence (OpenAI): for each distinct token with c > 0 occurrences in the
//      output, logit -= c * frequency + presence.
// Error (naming the token) if a history token is outside the row.
Status apply_penalties(std::span<float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, float repetition, float presence,
                       float frequency, SampleScratch* scratch = nullptr);

// The largest logit; -inf if none is finite (NaN never counts).
float max_logit(std::span<const float> logits);

// The greedy choice: the highest logit, lowest id on ties; -1 if every logit is -inf or NaN.
int32_t argmax_token(std::span<const float> logits);

// The k best tokens in token order (best first); fewer if the row is shorter. -inf logits count
// like any other value; NaN must not be present.
void select_top_k(std::span<const float> logits, int32_t k, std::vector<TokenLogit>& out);

// Random sampling after temperature and truncation. With m = the max logit,
//   s[t] = (logit[t] - m) / T   (fp32; s = 0 for the best token, -inf for masked ones)
//   w[t] = exp_nonpositive(s[t])   (sample_math.h; exactly 0 iff s[t] < kExpMinArg)
// the kept set K is a prefix of the token order, the shortest of:
//   top-k   the first k tokens (off when k <= 0 or k >= the number of finite logits);
//   top-p   the shortest prefix of the top-k set whose mass is >= top_p * (mass of the top-k set),
//           i.e. top-p acts on the top-k-renormalized distribution (off when top_p >= 1);
//   min-p   the tokens with s[t] >= logf(min_p), that is p >= min_p * p_max (off when min_p <= 0);
//   w > 0   the tokens with s[t] >= kExpMinArg (p / p_max >= 1.2e-38; the rest are never drawn).
// Masses are w summed in double. The token drawn for u in [0, 1) is the inverse CDF over K in
// ascending token id order: the first t in K with sum_{t' in K, t' <= t} w[t'] >
// u * sum_{t' in K} w[t'] (the last kept token if rounding leaves none). Returns -1 if no logit
// is finite. Summation order may differ between implementations (the CPU one sums the top-p mass
// by buckets), so a cut exactly at the top_p boundary may differ in the last bits; nothing else.
struct TruncationParams {
  float temperature = 1.0f;  // > 0
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
};
int32_t sample_truncated(std::span<const float> logits, const TruncationParams& params, double u,
                         SampleScratch* scratch = nullptr);

// The distribution sample_truncated draws from: K in ascending id order with w normalized to sum
// to 1. Empty if no logit is finite.
std::vector<TokenProb> truncated_distribution(std::span<const float> logits,
                                              const TruncationParams& params,
                                              SampleScratch* scratch = nullptr);

}  // namespace pagellm
