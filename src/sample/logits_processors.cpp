#include "sample/logits_processors.h"

#include "core/check.h"
#include "sample/sample_math.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

namespace pagellm {

// Sixteen running maxima so the loop vectorizes; max is exact, so the lane split cannot change
// the result.
float max_logit(std::span<const float> logits) {
  constexpr int kLanes = 16;
  const float* x = logits.data();
  const int64_t n = static_cast<int64_t>(logits.size());
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  float m = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (float l : lanes) m = l > m ? l : m;
  return m;
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Top-p over a large candidate set buckets tokens by their scaled log-probability s = (logit - max)
// / T so that only the bucket where the cumulative mass crosses top_p needs sorting. Bucket b holds
// s in (-(b+1)/32, -b/32]; tokens with w > 0 have s >= kExpMinArg > -88, so 88 nats cover them
// all (the last bucket catches anything beyond).
constexpr int kBucketsPerNat = 32;
constexpr int kNumBuckets = kBucketsPerNat * 88 + 1;
// Top-p without top-k sorts its candidates outright up to this many, else buckets them.
constexpr size_t kSortAllLimit = 4096;
// The implicit kept set (no top-k / top-p) is drawn from block by block.
constexpr int64_t kWalkBlock = 256;

inline int bucket_of(float scaled) {
  const float b = -scaled * static_cast<float>(kBucketsPerNat);
  return b >= static_cast<float>(kNumBuckets - 1) ? kNumBuckets - 1 : static_cast<int>(b);
}

Status token_out_of_range(const char* what, int64_t token, size_t vocab) {
  return out_of_range(std::string(what) + " token " + std::to_string(token) +
                      " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// The kept set of sample_truncated. Either explicit (scratch.kept / kept_weights, ascending ids,
// all weights > 0) or implicit: scratch.weights[t] for every token, 0 where not kept.
struct Kept {
  bool empty = false;
  bool implicit = false;
  double implicit_total = 0.0;  // sum of scratch.weights in ascending id order
};

Kept build_kept(std::span<const float> x, const TruncationParams& p, SampleScratch& s) {
  const int64_t n = static_cast<int64_t>(x.size());
  const float m = max_logit(x);
  Kept kept;
  if (!(m > kNegInf)) {
    kept.empty = true;
    return kept;
  }
  int64_t n_finite = n;
  const bool may_use_k = p.top_k > 0 && p.top_k < n;
  if (may_use_k) {
    n_finite = 0;
    for (int64_t i = 0; i < n; ++i) n_finite += x[i] > kNegInf;
  }
  const float t = p.temperature;
  const bool use_k = may_use_k && p.top_k < n_finite;
  const bool use_p = p.top_p < 1.0f;
  // Both cuts act on s, which is monotonic in the logit, so each keeps a prefix of the order.
  // The argmax has s = 0 >= s_min always (min_p <= 1).
  const float s_min = p.min_p > 0.0f ? std::max(kExpMinArg, std::log(p.min_p)) : kExpMinArg;
  s.kept.clear();
  s.kept_weights.clear();

  if (use_k) {
    // Only the k candidates matter: top-p and min-p act on the top-k-renormalized distribution.
    select_top_k(x, p.top_k, s.candidates);  // [k] best first, all finite
    const size_t k = s.candidates.size();
    s.border.resize(k);  // (s, token), same order
    for (size_t j = 0; j < k; ++j)
      s.border[j] = {(s.candidates[j].logit - m) / t, s.candidates[j].token};
    size_t len = k;
    if (use_p) {
      double total = 0.0;
      for (const TokenLogit& c : s.border) total += exp_nonpositive(c.logit);
      const double target = static_cast<double>(p.top_p) * total;
      double cum = 0.0;
      for (size_t j = 0; j < k; ++j) {
        cum += exp_nonpositive(s.border[j].logit);
        if (cum >= target) {
          len = j + 1;
          break;
        }
      }
    }
    while (len > 1 && s.border[len - 1].logit < s_min) --len;
    s.border.resize(len);
    std::sort(s.border.begin(), s.border.end(),
              [](const TokenLogit& a, const TokenLogit& b) { return a.token < b.token; });
    for (const TokenLogit& c : s.border) {
      s.kept.push_back(c.token);
      s.kept_weights.push_back(exp_nonpositive(c.logit));
    }
    return kept;
  }

  s.weights.resize(n);
  float* w = s.weights.data();
  if (!use_p) {
    // One vectorizable pass: weights of the kept tokens (0 elsewhere) and the mass of each block
    // of kWalkBlock tokens, so the draw can skip whole blocks.
    const int64_t n_blocks = (n + kWalkBlock - 1) / kWalkBlock;
    s.block_mass.resize(n_blocks);
    double total = 0.0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t lo = b * kWalkBlock, hi = std::min(n, lo + kWalkBlock);
      constexpr int kLanes = 8;
      double acc[kLanes] = {};
      int64_t i = lo;
      for (; i + kLanes <= hi; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) {
          const float sc = (x[i + j] - m) / t;
          const float e = exp_nonpositive(sc);  // unconditionally, so the select vectorizes
          w[i + j] = sc >= s_min ? e : 0.0f;
          acc[j] += w[i + j];
        }
      }
      for (; i < hi; ++i) {
        const float sc = (x[i] - m) / t;
        const float e = exp_nonpositive(sc);
        w[i] = sc >= s_min ? e : 0.0f;
        acc[0] += w[i];
      }
      double block = 0.0;
      for (double a : acc) block += a;
      s.block_mass[b] = block;
      total += block;
    }
    kept.implicit = true;
    kept.implicit_total = total;
    return kept;
  }

  // Top-p over the whole vocabulary. Pass 1 (vectorized): every w and the total mass z.
  double z = 0.0;
  {
    constexpr int kLanes = 8;
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        w[i + j] = exp_nonpositive((x[i + j] - m) / t);
        acc[j] += w[i + j];
      }
    for (; i < n; ++i) {
      w[i] = exp_nonpositive((x[i] - m) / t);
      acc[0] += w[i];
    }
    for (double a : acc) z += a;
  }
  const double target = static_cast<double>(p.top_p) * z;
  // Pass 2: the nucleus lies within {s >= theta} when the n tokens below theta can hold at most
  // (1 - top_p) z between them: n e^theta <= (1 - top_p) z. For a peaked distribution that is a
  // few dozen tokens. The 0.01 nat margin absorbs rounding; a larger set is still exact.
  const double theta_d = std::log((1.0 - static_cast<double>(p.top_p)) * z / n) - 0.01;
  const float theta = std::max(kExpMinArg, static_cast<float>(theta_d));
  s.border.clear();  // candidates, ascending ids
  for (int64_t i = 0; i < n; ++i)
    if ((x[i] - m) / t >= theta) s.border.push_back({x[i], static_cast<int32_t>(i)});
  s.candidates.clear();
  TokenLogit cut{};
  if (s.border.size() <= kSortAllLimit) {
    // Sort the candidates and walk the order.
    std::sort(s.border.begin(), s.border.end(), ranks_before);
    cut = s.border.back();
    double cum = 0.0;
    for (const TokenLogit& e : s.border) {
      cum += w[e.token];
      if (cum >= target) {
        cut = e;
        break;
      }
    }
    std::sort(s.border.begin(), s.border.end(),
              [](const TokenLogit& a, const TokenLogit& b) { return a.token < b.token; });
    for (const TokenLogit& e : s.border)
      if ((e.logit - m) / t >= s_min) s.candidates.push_back(e);
  } else {
    // A flat distribution: histogram the candidates' mass by bucket of s, find the bucket where
    // the cumulative mass (best bucket first) reaches top_p, and sort only that bucket.
    s.bucket_mass.assign(kNumBuckets, 0.0);
    for (const TokenLogit& e : s.border) s.bucket_mass[bucket_of((e.logit - m) / t)] += w[e.token];
    int cross = -1;
    double mass_before = 0.0;
    for (int b = 0; b < kNumBuckets; ++b) {
      if (s.bucket_mass[b] == 0.0) continue;
      if (mass_before + s.bucket_mass[b] >= target) {
        cross = b;
        break;
      }
      mass_before += s.bucket_mass[b];
    }
    if (cross < 0) {
      // Only reachable through rounding (top_p < 1 leaves a margin): keep every candidate.
      for (int b = kNumBuckets - 1; b >= 0 && cross < 0; --b)
        if (s.bucket_mass[b] > 0.0) cross = b;
      mass_before = -std::numeric_limits<double>::infinity();
    }
    std::vector<TokenLogit>& in_cross = s.kept_candidates;
    in_cross.clear();
    for (const TokenLogit& e : s.border) {
      const float scaled = (e.logit - m) / t;
      const int b = bucket_of(scaled);
      if (b > cross) continue;
      // The cut needs the whole crossing bucket; min-p only filters what is finally kept.
      if (b == cross) in_cross.push_back(e);
      if (scaled >= s_min) s.candidates.push_back(e);  // ascending ids
    }
    PAGELLM_CHECK(!in_cross.empty());  // the crossing bucket has mass, so it has members
    std::sort(in_cross.begin(), in_cross.end(), ranks_before);
    cut = in_cross.back();
    double cum = mass_before;
    for (const TokenLogit& e : in_cross) {
      cum += w[e.token];
      if (cum >= target) {
        cut = e;
        break;
      }
    }
  }
  // The kept set is the prefix of the token order that ends at the cut (a token in a better
  // bucket has a strictly larger logit, so bucket order agrees with the token order).
  for (const TokenLogit& e : s.candidates) {
    if (ranks_before(cut, e)) continue;
    s.kept.push_back(e.token);
    s.kept_weights.push_back(w[e.token]);
  }
  return kept;
}

}  // namespace

Status check_logits_row(std::span<const float> logits, int64_t row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Branch-free scan (vectorizes); the slow search for the culprit only runs on failure.
  int32_t n_bad = 0, n_finite = 0;  // int32 lanes: a vocabulary is < 2^31 tokens
  for (const float v : logits) {
    n_bad += !(v < kInf);  // NaN or +inf
    n_finite += v > kNegInf;
  }
  const bool any_finite = n_finite > 0;
  if (n_bad > 0) {
    for (size_t i = 0; i < logits.size(); ++i) {
      const float v = logits[i];
      if (!(v < kInf))
        return invalid_argument("logits row " + std::to_string(row) + ": token " +
                                std::to_string(i) + " has a non-finite logit (" +
                                (std::isnan(v) ? "nan" : "+inf") + ")");
    }
  }
  if (!any_finite)
    return invalid_argument("logits row " + std::to_string(row) + ": every logit is -inf");
  return Status::ok_status();
}

Status apply_logit_bias(std::span<float> logits, std::span<const LogitBias> bias) {
  for (const LogitBias& b : bias) {
    if (b.token < 0 || static_cast<size_t>(b.token) >= logits.size())
      return token_out_of_range("logit_bias", b.token, logits.size());
    logits[b.token] += b.bias;
  }
  return Status::ok_status();
}

Status suppress_tokens(std::span<float> logits, std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<size_t>(t) >= logits.size())
      return token_out_of_range("suppressed", t, logits.size());
    logits[t] = kNegInf;
  }
  return Status::ok_status();
}

Status apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (static_cast<int64_t>(allowed.size()) < token_mask_words(n))
    return invalid_argument("token mask of " + std::to_string(allowed.size()) + " words for " +
                            std::to_string(n) + " logits");
  for (int64_t w = 0; w < token_mask_words(n); ++w) {
    const uint32_t bits = allowed[w];
    if (bits == 0xffffffffu) continue;  // the common case: a whole word allowed
    const int64_t end = std::min<int64_t>(n, (w + 1) * 32);
    for (int64_t t = w * 32; t < end; ++t)
      if (!(bits >> (t & 31) & 1u)) logits[t] = kNegInf;
  }
  return Status::ok_status();
}

Status apply_penalties(std::span<float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, float repetition, float presence,
                       float frequency, SampleScratch* scratch) {
  const bool use_rep = repetition != 1.0f;
  const bool use_pf = presence != 0.0f || frequency != 0.0f;
  if (!use_rep && !use_pf) return Status::ok_status();
  SampleScratch local;
  SampleScratch& s = scratch ? *scratch : local;
  const size_t vocab = logits.size();
  if (s.stamp.size() != vocab) {
    s.stamp.assign(vocab, 0);
    s.count.assign(vocab, 0);
    s.epoch = 0;
  }
  if (++s.epoch == 0) {  // wrapped: stale stamps could alias the new epoch
    std::fill(s.stamp.begin(), s.stamp.end(), 0);
    s.epoch = 1;
  }
  const uint32_t epoch = s.epoch;
  s.touched.clear();
  // Count output occurrences; `touched` lists each distinct output token once.
  for (int32_t t : output) {
    if (t < 0 || static_cast<size_t>(t) >= vocab) return token_out_of_range("output", t, vocab);
    if (s.stamp[t] != epoch) {
      s.stamp[t] = epoch;
      s.count[t] = 0;
      s.touched.push_back(t);
    }
    ++s.count[t];
  }
  const size_t n_output_distinct = s.touched.size();
  if (use_rep) {
    // Prompt tokens not seen in the output join `touched` with count 0 (no presence/frequency).
    for (int32_t t : prompt) {
      if (t < 0 || static_cast<size_t>(t) >= vocab) return token_out_of_range("prompt", t, vocab);
      if (s.stamp[t] != epoch) {
        s.stamp[t] = epoch;
        s.count[t] = 0;
        s.touched.push_back(t);
      }
    }
    for (int32_t t : s.touched) {
      const float v = logits[t];
      logits[t] = v > 0.0f ? std::min(v / repetition, FLT_MAX) : std::max(v * repetition, -FLT_MAX);
      if (v == kNegInf) logits[t] = kNegInf;  // masked stays masked
    }
  }
  if (use_pf) {
    for (size_t j = 0; j < n_output_distinct; ++j) {
      const int32_t t = s.touched[j];
      logits[t] -= static_cast<float>(s.count[t]) * frequency + presence;
    }
  }
  return Status::ok_status();
}

int32_t argmax_token(std::span<const float> logits) {
  // A vectorized max, then the first index that holds it (the lowest id wins ties).
  const float m = max_logit(logits);
  if (!(m > kNegInf)) return -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] == m) return static_cast<int32_t>(i);
  return -1;
}

void select_top_k(std::span<const float> logits, int32_t k, std::vector<TokenLogit>& out) {
  out.clear();
  const int64_t n = static_cast<int64_t>(logits.size());
  if (k <= 0 || n == 0) return;
  if (k >= n) {
    out.reserve(n);
    for (int64_t i = 0; i < n; ++i) out.push_back({logits[i], static_cast<int32_t>(i)});
    std::sort(out.begin(), out.end(), ranks_before);
    return;
  }
  // A buffer of up to `cap` candidates, pruned to the best k whenever it fills. Ids arrive in
  // ascending order, so after a prune a new token beats the k-th best only with a strictly larger
  // logit: one compare rejects almost every token. Amortized O(n + k log k).
  const size_t kk = static_cast<size_t>(k);
  const size_t cap = std::max<size_t>(2 * kk, kk + 64);
  out.reserve(cap);
  bool pruned = false;
  float threshold = kNegInf;
  auto prune = [&] {
    std::nth_element(out.begin(), out.begin() + (kk - 1), out.end(), ranks_before);
    out.resize(kk);
    threshold = out[kk - 1].logit;
    pruned = true;
  };
  for (int64_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (pruned && !(v > threshold)) continue;
    out.push_back({v, static_cast<int32_t>(i)});
    if (out.size() == cap) prune();
  }
  if (out.size() > kk) prune();
  std::sort(out.begin(), out.end(), ranks_before);
}

int32_t sample_truncated(std::span<const float> logits, const TruncationParams& params, double u,
                         SampleScratch* scratch) {
  SampleScratch local;
  SampleScratch& s = scratch ? *scratch : local;
  const Kept kept = build_kept(logits, params, s);
  if (kept.empty) return -1;
  int32_t last = -1;
  if (!kept.implicit) {
    double total = 0.0;
    for (float w : s.kept_weights) total += w;
    const double target = u * total;
    double cum = 0.0;
    for (size_t j = 0; j < s.kept.size(); ++j) {
      cum += s.kept_weights[j];
      last = s.kept[j];
      if (cum > target) return last;
    }
    return last;
  }
  // Skip whole blocks while the CDF stays <= target, then walk the block that crosses it. Block
  // masses and the in-block walk round differently, so a walk that falls short moves on.
  const int64_t n = static_cast<int64_t>(logits.size());
  const float* w = s.weights.data();
  const double target = u * kept.implicit_total;
  double cum = 0.0;
  const int64_t n_blocks = static_cast<int64_t>(s.block_mass.size());
  for (int64_t b = 0; b < n_blocks; ++b) {
    if (cum + s.block_mass[b] <= target) {
      cum += s.block_mass[b];
      continue;
    }
    const int64_t hi = std::min(n, (b + 1) * kWalkBlock);
    for (int64_t i = b * kWalkBlock; i < hi; ++i) {
      if (w[i] <= 0.0f) continue;
      cum += w[i];
      if (cum > target) return static_cast<int32_t>(i);
    }
  }
  for (int64_t i = n - 1; i >= 0; --i)  // rounding left nothing: the last kept token
    if (w[i] > 0.0f) return static_cast<int32_t>(i);
  return last;
}

std::vector<TokenProb> truncated_distribution(std::span<const float> logits,
                                              const TruncationParams& params,
                                              SampleScratch* scratch) {
  SampleScratch local;
  SampleScratch& s = scratch ? *scratch : local;
  const Kept kept = build_kept(logits, params, s);
  std::vector<TokenProb> dist;
  if (kept.empty) return dist;
  if (!kept.implicit) {
    for (size_t j = 0; j < s.kept.size(); ++j) dist.push_back({s.kept[j], s.kept_weights[j]});
  } else {
    for (size_t i = 0; i < logits.size(); ++i)
      if (s.weights[i] > 0.0f) dist.push_back({static_cast<int32_t>(i), s.weights[i]});
  }
  double total = 0.0;
  for (const TokenProb& tp : dist) total += tp.prob;
  for (TokenProb& tp : dist) tp.prob /= total;
  return dist;
}

}  // namespace pagellm
