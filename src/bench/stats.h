// Client-side serving statistics: per-request timings -> throughput, TTFT/TPOT/ITL/latency
// summaries, goodput under an SLO, failures by kind. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace pagellm::bench {

// What one request measured. Times are seconds on std::chrono::steady_clock, relative to the
// moment the request was sent (connect included); start_s is relative to the start of the run.
struct RequestResult {
  bool ok = false;
  std::string error_kind;    // "" when ok; else connect, http_<status>, timeout, stalled, dropped, malformed_sse, ...
  std::string error_detail;  // one line for the log
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double start_s = 0;
  double ttft_s = 0;               // first content chunk
  double latency_s = 0;            // end of stream
  std::vector<double> itl_s;       // gaps between successive content chunks
};

// mean/p50/p90/p99/max of a sample, in the unit of the input. n == 0 -> all zero.
struct Summary {
  int64_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// The q-th percentile (0..100) of `sorted` (ascending, non-empty) by linear interpolation between
// closest ranks: numpy.percentile's default ("linear") method.
double percentile_sorted(const std::vector<double>& sorted, double q);
Summary summarize(std::vector<double> values);

// Time per output token after the first: (latency - ttft) / (output_tokens - 1); nullopt when the
// request produced fewer than two tokens (the quantity is undefined).
std::optional<double> tpot_s(const RequestResult& r);

// A latency SLO. A request is "good" when it succeeded and every bound that is set holds
// (a TPOT bound holds trivially for a request with < 2 output tokens).
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
  std::string to_string() const;
};
// "ttft=500,tpot=30[,e2el=10000]" (milliseconds).
Result<Slo> parse_slo(std::string_view spec);
bool meets_slo(const RequestResult& r, const Slo& slo);

struct BenchMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  std::map<std::string, int64_t> failures;  // kind -> count
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double request_throughput = 0;      // completed requests / s
  double input_throughput = 0;        // prompt tok/s
  double output_throughput = 0;       // output tok/s
  double total_token_throughput = 0;  // (prompt + output) tok/s
  int64_t n_good = 0;                 // requests meeting the SLO
  double goodput = 0;                 // n_good / duration_s; equals request_throughput without an SLO
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

// `duration_s`: wall time from the first arrival to the last completion (> 0).
BenchMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s, const Slo& slo);

}  // namespace pagellm::bench
