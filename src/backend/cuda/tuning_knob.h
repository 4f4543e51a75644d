// Tuning knobs: integer settings a kernel's launcher reads from the environment, so that one
// binary can be measured both ways (A/B runs) and tests can force a path. Callers cache the value
// in a function-local static: it is read once per process.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace pagellm::cuda {

// The value of environment variable `name` when it is set and `valid` accepts it, else
// `fallback` (unset, or a value out of range: the default, never a half-applied setting).
template <typename Valid>
int64_t tuning_knob(const char* name, int64_t fallback, Valid valid) {
  const char* e = std::getenv(name);
  if (e == nullptr) return fallback;
  const int64_t v = std::atoll(e);
  return valid(v) ? v : fallback;
}

}  // namespace pagellm::cuda
