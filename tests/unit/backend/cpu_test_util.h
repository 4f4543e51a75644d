// Helpers for the CPU backend tests: seeded random data, guarded output buffers, the backends to
// compare (reference and every fast ISA this CPU runs), and tolerance checks that report the seed.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace pagellm::testing {

// A value no op ever produces from our inputs: written around outputs, checked untouched after.
inline constexpr float kSentinel = -12345.678f;
inline constexpr int64_t kGuard = 16;  // guard floats after every buffer

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A float buffer of n values followed by kGuard sentinels.
struct GuardedBuffer {
  std::vector<float> data;
  int64_t n;
  explicit GuardedBuffer(int64_t n_values, float fill = kSentinel)
      : data(n_values + kGuard, fill), n(n_values) {
    std::fill(data.begin() + n, data.end(), kSentinel);
  }
  float* ptr() { return data.data(); }
  bool guard_intact() const {
    for (int64_t i = n; i < n + kGuard; ++i)
      if (std::memcmp(&data[i], &kSentinel, 4) != 0) return false;
    return true;
  }
};

// Every fast backend this CPU can run, with its ISA name.
struct NamedBackend {
  std::string isa;
  std::unique_ptr<Backend> backend;
};
inline std::vector<NamedBackend> fast_backends() {
  std::vector<NamedBackend> out;
  for (const cpu::Kernels* k : cpu::supported_kernels())
    out.push_back({k->isa, cpu::make_cpu_backend_for(k)});
  return out;
}
// The plain reference backend first, then every fast one.
inline std::vector<NamedBackend> all_backends() {
  std::vector<NamedBackend> all = fast_backends();
  all.insert(all.begin(), NamedBackend{"reference", make_cpu_backend(false)});
  return all;
}

// |got - want| <= tol, with a message naming the context (seed, case) and index.
#define PAGELLM_EXPECT_CLOSE(got, want, tol, ctx, idx)                                          \
  EXPECT_LE(std::fabs(static_cast<double>(got) - static_cast<double>(want)), (tol))              \
      << (ctx) << " index " << (idx) << ": got " << (got) << " want " << (want)

}  // namespace pagellm::testing
