// Reads the Prometheus text exposition format (what /metrics serves) and compares two scrapes, so
// that a benchmark can report the server's own view of TTFT, ITL and latency beside its own.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/status.h"

namespace pagellm::bench {

// Sample name -> value, summed over label sets (`vllm:x_sum{model="a"} 1` and `{model="b"} 2`
// give "vllm:x_sum" = 3). Comments, HELP and TYPE lines are skipped; a malformed sample line is an
// error naming its line number.
using PromSamples = std::map<std::string, double>;
Result<PromSamples> parse_prometheus(std::string_view text);

// Mean and count of a histogram over the interval between two scrapes.
struct HistogramDelta {
  double count = 0;
  double sum = 0;
  double mean() const { return count > 0 ? sum / count : 0; }
};
// Nullopt-like: count 0 when the histogram is in neither scrape.
HistogramDelta histogram_delta(const PromSamples& before, const PromSamples& after, const std::string& name);
double counter_delta(const PromSamples& before, const PromSamples& after, const std::string& name);

}  // namespace pagellm::bench
