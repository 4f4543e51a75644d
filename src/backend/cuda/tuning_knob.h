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

// An on/off knob: 0 or 1 in the environment, else `fallback`.
inline bool tuning_switch(const char* name, bool fallback) {
  return tuning_knob(name, fallback ? 1 : 0, [](int64_t v) { return v == 0 || v == 1; }) != 0;
}

// Whether the short kernels that may let their successor launch before their own wait do so
// (pdl_wait_and_release in device_utils.cuh): the norm ops CudaBackend runs alone (not the norm
// of rms_norm_matmul and rms_norm_swiglu) and the MoE combine. On by default;
// PAGELLM_EARLY_RELEASE=0 turns it off, to measure it (docs/PERF.md "Twenty-first round").
inline bool early_release() {
  static const bool on = tuning_switch("PAGELLM_EARLY_RELEASE", true);
  return on;
}

}  // namespace pagellm::cuda
