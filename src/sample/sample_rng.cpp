#include "sample/sample_rng.h"

#include <atomic>
#include <chrono>
#include <random>

namespace pagellm {

uint64_t draw_random_seed() {
  // One entropy draw per process; after that a Weyl sequence through mix64 gives distinct,
  // well-mixed seeds without locking. The clock guards against a deterministic random_device.
  static std::atomic<uint64_t> state = [] {
    std::random_device rd;
    const uint64_t hi = rd(), lo = rd();
    const uint64_t t = static_cast<uint64_t>(
        std::chrono::high_resolution_clock::now().time_since_epoch().count());
    return mix64((hi << 32) ^ lo ^ mix64(t));
  }();
  return mix64(state.fetch_add(0x9e3779b97f4a7c15ull, std::memory_order_relaxed));
}

}  // namespace pagellm
