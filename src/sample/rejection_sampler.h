// Speculative decoding's verification of guesses that were drawn from a distribution: the standard
// rejection sampler (Leviathan et al. 2023, Chen et al. 2023). With q the proposer's distribution
// a guess g was drawn from and p the target's (both after every sampling processor, as
// Sampler::distribution gives them):
//
//   keep g with probability min(1, p(g) / q(g));
//   at the first guess not kept, draw the token from the residual r = max(0, p - q) / |max(0, p -
//   q)| instead, and the draft ends there; when every guess is kept, the row after the last one is
//   sampled from its p as plain decoding would.
//
// Each token then follows p exactly, whatever q is: P(token = t) = min(p, q)(t) + (1 - sum min(p,
// q)) r(t) = p(t). A guess from a one-hot q (prompt lookup, a greedy draft) is kept with
// probability p(g), which is what the engine's exact verification gives such guesses too.
//
// Distributions are sparse: TokenProb lists in ascending token id order whose masses sum to 1.
// The uniforms come from their own streams of the sequence's seed (stream_seed), so that the
// plain sampling stream keeps its meaning for the rows drawn from p.
#pragma once

#include <cstdint>
#include <span>

#include "sample/logits_processors.h"
#include "sample/sample_rng.h"

namespace pagellm {

// The probability of `token` in a sparse distribution (0 when it is not listed).
double probability_of(std::span<const TokenProb> dist, int32_t token);

// Inverse CDF in ascending id order: the first token whose cumulative mass exceeds u * total
// (the last one if rounding leaves none); -1 for an empty distribution.
int32_t draw_from(std::span<const TokenProb> dist, double u);

// Whether guess g, drawn from q, is kept against p for a uniform u in [0, 1).
bool keep_guess(std::span<const TokenProb> p, std::span<const TokenProb> q, int32_t guess,
                double u);

// The token for a rejected guess: drawn from max(0, p - q) normalized, with uniform u. When that
// mass is zero (p and q equal up to rounding, where a rejection is a rounding event) it is drawn
// from p.
int32_t draw_residual(std::span<const TokenProb> p, std::span<const TokenProb> q, double u);

// The random streams of speculative sampling, apart from the sequence's plain stream (seed).
enum class SpecStream : uint64_t {
  kDraft = 0x6a09e667f3bcc908ull,     // the proposer's draws of its guesses
  kAccept = 0xbb67ae8584caa73bull,    // keep_guess's uniforms
  kResidual = 0x3c6ef372fe94f82bull,  // draw_residual's uniforms
};
constexpr uint64_t stream_seed(uint64_t seed, SpecStream s) {
  return mix64(seed ^ static_cast<uint64_t>(s));
}

}  // namespace pagellm
