// The load generator's HTTP side: an asynchronous Boost.Beast client that sends every request of a
// workload at its scheduled time (open loop) to an OpenAI-compatible /v1/completions endpoint with
// "stream": true, timestamps each SSE chunk on std::chrono::steady_clock and classifies failures.
// All connections share one io_context on one thread; every request has a deadline, so a run
// always ends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/stats.h"
#include "bench/workload.h"
#include "core/status.h"

namespace pagellm::bench {

// http://host[:port][/prefix] (https is refused: a benchmark client adds no TLS cost of its own).
struct Endpoint {
  std::string host;
  std::string port = "80";
  std::string prefix;  // without a trailing '/'; "" for none
};
Result<Endpoint> parse_base_url(std::string_view url);

struct ClientOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;
  std::string path = "/v1/completions";
  double timeout_s = 600;        // whole-request deadline, connect included
  double stall_timeout_s = 60;   // no byte for this long -> "stalled"
  bool keep_alive = false;       // reuse connections (off: one connection per request)
  int64_t max_concurrency = 0;   // requests in flight at most (0: unbounded); arrivals beyond wait
  bool ignore_eos = true;
  std::string api_key;           // sent as "Authorization: Bearer ..." when set
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
};

// The JSON body of one streamed completion request.
std::string completion_body(const ClientOptions& o, const BenchRequest& r);

struct LoadResult {
  std::vector<RequestResult> results;  // in workload order
  double duration_s = 0;               // run start to last completion
};

// Sends reqs[i] at send_times_s[i] seconds after the start (same sizes). Errors only for bad
// options (URL, sizes, unresolvable host); request failures are in the results.
Result<LoadResult> run_load(const ClientOptions& o, const std::vector<BenchRequest>& reqs,
                            const std::vector<double>& send_times_s);

// One GET (e.g. /metrics, /health) with a deadline. Returns the body of a 2xx response, else an
// error naming the URL and status.
Result<std::string> http_get(const std::string& base_url, const std::string& path, double timeout_s);

}  // namespace pagellm::bench
