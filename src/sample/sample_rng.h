// Counter-based random numbers for sampling. A sequence's random number at a step is a pure
// function of (seed, step), where step = the number of tokens it has generated so far: no shared
// stream, so the tokens a seeded request gets do not depend on what else is in the batch, on the
// batch order, on preemption and recompute, or on the device. The functions are constexpr and
// header-only so a CUDA kernel can compute the identical value (mark them __host__ __device__
// there through PAGELLM_SAMPLE_HD).
//
//   mix64(z)             the splitmix64 finalizer of z + 0x9e3779b97f4a7c15 (Steele et al.).
//   random_bits(s, i)    mix64(mix64(s) ^ mix64(i ^ 0x5851f42d4c957f2d))
//   uniform01(s, i)      (random_bits(s, i) >> 11) * 2^-53, a double in [0, 1).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PAGELLM_SAMPLE_HD __host__ __device__
#else
#define PAGELLM_SAMPLE_HD
#endif

namespace pagellm {

PAGELLM_SAMPLE_HD constexpr uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 random bits for (seed, step). The step is hashed on its own before combining so that
// neighbouring seeds and neighbouring steps do not produce related streams.
PAGELLM_SAMPLE_HD constexpr uint64_t random_bits(uint64_t seed, uint64_t step) {
  return mix64(mix64(seed) ^ mix64(step ^ 0x5851f42d4c957f2dull));
}

// A uniform double in [0, 1) with 53 random bits.
PAGELLM_SAMPLE_HD constexpr double uniform01(uint64_t seed, uint64_t step) {
  return static_cast<double>(random_bits(seed, step) >> 11) * 0x1.0p-53;
}

// The seed of completion `index` of a request with n > 1: index 0 keeps the request's seed (so
// n = 1 and the first of n agree); the others get unrelated seeds.
PAGELLM_SAMPLE_HD constexpr uint64_t derive_sequence_seed(uint64_t request_seed, uint32_t index) {
  return index == 0 ? request_seed : mix64(request_seed ^ mix64(0xa0761d6478bd642full + index));
}

// A fresh seed for a request that did not set one, drawn at admission from a process-wide source
// (std::random_device mixed with a counter); thread-safe.
uint64_t draw_random_seed();

}  // namespace pagellm
