// Open-loop arrival processes: when each request is sent, fixed before the run starts and
// independent of how fast the server answers (a closed loop would slow its own offered load down
// exactly when the server struggles, hiding queueing delay).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace pagellm::bench {

enum class ArrivalKind {
  kPoisson,   // exponential inter-arrival times (coefficient of variation 1)
  kGamma,     // gamma inter-arrivals, shape k = burstiness, same mean: CV = 1/sqrt(k)
  kMix,       // each gap exponential, or with probability heavy_fraction Pareto(alpha): same mean
  kConstant,  // exactly 1/rate apart
};

struct ArrivalOptions {
  ArrivalKind kind = ArrivalKind::kPoisson;
  // Requests per second; +infinity sends every request at t = 0.
  double rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;      // gamma shape k; < 1 burstier than Poisson, > 1 more regular
  double heavy_fraction = 0.2;  // mix: share of Pareto gaps
  double pareto_alpha = 1.5;    // mix: tail index (> 1 so the mean exists)
  uint64_t seed = 0;
};

Result<ArrivalKind> parse_arrival_kind(std::string_view name);
const char* arrival_kind_name(ArrivalKind kind);

// Send times in seconds from the start of the run, non-decreasing, first gap included (so the
// first request is not always at 0, except for rate = inf). Deterministic for a given seed.
Result<std::vector<double>> arrival_times(const ArrivalOptions& o, int64_t n);

}  // namespace pagellm::bench
