// Benchmark reports: the versioned JSON document (schema "pagellm.bench.serve/1") and the
// Markdown tables printed on stdout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/prometheus.h"
#include "bench/stats.h"

namespace pagellm::bench {

inline constexpr const char* kReportSchema = "pagellm.bench.serve/1";

// The server's own view over the run, from two /metrics scrapes (vLLM metric names).
struct ServerSideMetrics {
  HistogramDelta ttft_s;   // vllm:time_to_first_token_seconds
  HistogramDelta itl_s;    // vllm:inter_token_latency_seconds (older vLLM: time_per_output_token)
  HistogramDelta e2el_s;   // vllm:e2e_request_latency_seconds
  HistogramDelta queue_s;  // vllm:request_queue_time_seconds
  double prompt_tokens = 0;      // vllm:prompt_tokens_total
  double generation_tokens = 0;  // vllm:generation_tokens_total
  double preemptions = 0;        // vllm:num_preemptions_total
  double prefix_cache_queries = 0;  // vllm:prefix_cache_queries_total (prompt tokens looked up)
  double prefix_cache_hits = 0;     // vllm:prefix_cache_hits_total (of those, found cached)
  // pagellm:engine_busy_seconds_total: wall time the engine spent executing steps (a GPU step
  // includes its kernels and the wait for its sampled ids). Over the run's duration it is the
  // GPU busy fraction; absent (0) on other servers.
  double busy_seconds = 0;
  // Speculative decoding (vllm:spec_decode_num_drafts / _draft_tokens / _accepted_tokens):
  // acceptance rate = accepted / draft tokens; mean accepted length = 1 + accepted / drafts.
  double spec_drafts = 0;
  double spec_draft_tokens = 0;
  double spec_accepted_tokens = 0;
  bool any() const { return ttft_s.count > 0 || itl_s.count > 0 || e2el_s.count > 0 || generation_tokens > 0; }
};
ServerSideMetrics server_side_metrics(const PromSamples& before, const PromSamples& after);

struct RunReport {
  double request_rate = 0;  // +inf for all-at-once
  std::string arrival;
  double burstiness = 1;
  int64_t max_concurrency = 0;
  int64_t num_prompts = 0;
  // Where this run's prompts came from (bench/workload.h: each run of a sweep draws its own):
  // the seed of a synthetic workload or of a ShareGPT shuffle, and a file dataset's first entry.
  uint64_t workload_seed = 0;
  int64_t dataset_first = -1;  // -1: not a file dataset
  BenchMetrics metrics;
  std::optional<ServerSideMetrics> server;
  std::vector<RequestResult> requests;  // kept for --save-requests
};

nlohmann::json summary_json(const Summary& s);
// One run's JSON object; per-request data only when `with_requests`.
nlohmann::json run_json(const RunReport& r, const Slo& slo, bool with_requests);
// Fraction of requests (failures included) meeting the SLO.
double slo_attainment(const RunReport& r);

// The Markdown report of one run.
std::string run_markdown(const RunReport& r, const Slo& slo);
// One row per rate of a sweep, and the verdict line.
std::string sweep_markdown(const std::vector<RunReport>& runs, const Slo& slo, std::optional<double> best_rate,
                           double attainment_target);
// The highest rate whose SLO attainment reaches `attainment_target` (runs in any order).
std::optional<double> best_rate_meeting_slo(const std::vector<RunReport>& runs, double attainment_target);

}  // namespace pagellm::bench
