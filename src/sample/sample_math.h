// exp for the sampler's fp32 weights, w = exp(s) with s = (logit - max) / T <= 0.
//
// Our own branch-free exp so that the loops over a 128k vocabulary vectorize (a libm expf call per
// element does not, and costs most of a sampling step). Cody-Waite reduction s = n ln2 + r with
// |r| <= ln2 / 2, then the degree-6 Taylor polynomial of e^r (truncation error r^7/7! < 1.3e-7
// relative), scaled by 2^n built from the exponent bits: within 3 ulp of the true value. Below
// kExpMinArg (where e^s leaves the normal fp32 range) it returns exactly 0, so "w > 0" is the same
// test as "s >= kExpMinArg", a monotonic cut. Only plain + and * are used (no fma), so any IEEE
// fp32 machine without contraction computes identical bits (nvcc: use __fmul_rn / __fadd_rn).
#pragma once

#include <bit>
#include <cstdint>

#include "sample/sample_rng.h"  // PAGELLM_SAMPLE_HD

namespace pagellm {

// ln(FLT_MIN): e^s for s below this is subnormal; we flush it to 0.
inline constexpr float kExpMinArg = -87.33654f;

// e^s for s <= 0 (larger s is clamped to 0, i.e. returns 1).
PAGELLM_SAMPLE_HD inline float exp_nonpositive(float s) {
  const float x = s < kExpMinArg ? kExpMinArg : (s > 0.0f ? 0.0f : s);
  // n = round(x / ln2) by the 1.5 * 2^23 trick (round-to-nearest-even; |x / ln2| < 2^22).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  // ln2 split so that n * kLn2Hi is exact for |n| <= 2^7.
  constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;  // in [1, 127] for x in [kExpMinArg, 0]
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
  return s < kExpMinArg ? 0.0f : p * scale;
}

}  // namespace pagellm
