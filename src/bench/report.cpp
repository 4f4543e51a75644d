#include "bench/report.h"

#include <cmath>
#include <cstdio>

namespace pagellm::bench {

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string rate_str(double r) { return std::isinf(r) ? "inf" : fmt("%g", r); }

nlohmann::json rate_json(double r) { return std::isinf(r) ? nlohmann::json("inf") : nlohmann::json(r); }

nlohmann::json hist_json(const HistogramDelta& h) {
  return {{"count", h.count}, {"mean_ms", h.mean() * 1e3}};
}

}  // namespace

ServerSideMetrics server_side_metrics(const PromSamples& before, const PromSamples& after) {
  ServerSideMetrics s;
  s.ttft_s = histogram_delta(before, after, "vllm:time_to_first_token_seconds");
  s.itl_s = histogram_delta(before, after, "vllm:inter_token_latency_seconds");
  if (s.itl_s.count == 0) s.itl_s = histogram_delta(before, after, "vllm:time_per_output_token_seconds");
  s.e2el_s = histogram_delta(before, after, "vllm:e2e_request_latency_seconds");
  s.queue_s = histogram_delta(before, after, "vllm:request_queue_time_seconds");
  s.prompt_tokens = counter_delta(before, after, "vllm:prompt_tokens_total");
  s.generation_tokens = counter_delta(before, after, "vllm:generation_tokens_total");
  s.preemptions = counter_delta(before, after, "vllm:num_preemptions_total");
  s.prefix_cache_queries = counter_delta(before, after, "vllm:prefix_cache_queries_total");
  s.prefix_cache_hits = counter_delta(before, after, "vllm:prefix_cache_hits_total");
  s.busy_seconds = counter_delta(before, after, "pagellm:engine_busy_seconds_total");
  s.spec_drafts = counter_delta(before, after, "vllm:spec_decode_num_drafts_total");
  s.spec_draft_tokens = counter_delta(before, after, "vllm:spec_decode_num_draft_tokens_total");
  s.spec_accepted_tokens =
      counter_delta(before, after, "vllm:spec_decode_num_accepted_tokens_total");
  return s;
}

nlohmann::json summary_json(const Summary& s) {
  return {{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}, {"n", s.n}};
}

double slo_attainment(const RunReport& r) {
  const int64_t n = r.metrics.completed + r.metrics.failed;
  return n > 0 ? static_cast<double>(r.metrics.n_good) / static_cast<double>(n) : 0.0;
}

nlohmann::json run_json(const RunReport& r, const Slo& slo, bool with_requests) {
  const BenchMetrics& m = r.metrics;
  nlohmann::json j = {{"request_rate", rate_json(r.request_rate)},
                      {"arrival", r.arrival},
                      {"burstiness", r.burstiness},
                      {"max_concurrency", r.max_concurrency},
                      {"num_prompts", r.num_prompts},
                      {"workload_seed", r.workload_seed},
                      {"duration_s", m.duration_s},
                      {"completed", m.completed},
                      {"failed", m.failed},
                      {"failures", m.failures},
                      {"total_input_tokens", m.total_input_tokens},
                      {"total_output_tokens", m.total_output_tokens},
                      {"request_throughput", m.request_throughput},
                      {"input_throughput", m.input_throughput},
                      {"output_throughput", m.output_throughput},
                      {"total_token_throughput", m.total_token_throughput},
                      {"goodput", m.goodput},
                      {"slo", slo.to_string()},
                      {"slo_attainment", slo_attainment(r)},
                      {"ttft_ms", summary_json(m.ttft_ms)},
                      {"tpot_ms", summary_json(m.tpot_ms)},
                      {"itl_ms", summary_json(m.itl_ms)},
                      {"e2el_ms", summary_json(m.e2el_ms)}};
  if (r.dataset_first >= 0) j["dataset_first"] = r.dataset_first;
  if (r.server && r.server->any()) {
    const ServerSideMetrics& s = *r.server;
    j["server"] = {{"ttft", hist_json(s.ttft_s)},         {"itl", hist_json(s.itl_s)},
                   {"e2el", hist_json(s.e2el_s)},         {"queue", hist_json(s.queue_s)},
                   {"prompt_tokens", s.prompt_tokens},    {"generation_tokens", s.generation_tokens},
                   {"preemptions", s.preemptions},
                   {"prefix_cache_queries", s.prefix_cache_queries},
                   {"prefix_cache_hits", s.prefix_cache_hits},
                   {"busy_seconds", s.busy_seconds}};
    if (s.busy_seconds > 0 && m.duration_s > 0) j["server"]["busy_fraction"] = s.busy_seconds / m.duration_s;
    if (s.spec_drafts > 0) {
      j["server"]["spec_drafts"] = s.spec_drafts;
      j["server"]["spec_draft_tokens"] = s.spec_draft_tokens;
      j["server"]["spec_accepted_tokens"] = s.spec_accepted_tokens;
      j["server"]["spec_acceptance_rate"] = s.spec_accepted_tokens / s.spec_draft_tokens;
      j["server"]["spec_mean_accepted_length"] = 1.0 + s.spec_accepted_tokens / s.spec_drafts;
    }
  }
  if (with_requests) {
    nlohmann::json reqs = nlohmann::json::array();
    for (const RequestResult& q : r.requests) {
      nlohmann::json o = {{"ok", q.ok}, {"start_s", q.start_s}, {"prompt_tokens", q.prompt_tokens},
                          {"output_tokens", q.output_tokens}, {"ttft_s", q.ttft_s}, {"latency_s", q.latency_s},
                          {"itl_s", q.itl_s}};
      if (!q.ok) {
        o["error"] = q.error_kind;
        o["error_detail"] = q.error_detail;
      }
      reqs.push_back(std::move(o));
    }
    j["requests"] = std::move(reqs);
  }
  return j;
}

std::string run_markdown(const RunReport& r, const Slo& slo) {
  const BenchMetrics& m = r.metrics;
  std::string s;
  s += "| metric | value |\n|---|---:|\n";
  auto row = [&](const std::string& k, const std::string& v) { s += "| " + k + " | " + v + " |\n"; };
  row("request rate (req/s)",
      std::isinf(r.request_rate)
          ? std::string("inf (all at once)")
          : rate_str(r.request_rate) + " (" + r.arrival +
                (r.arrival == "gamma" ? ", burstiness " + fmt("%g", r.burstiness) : "") + ")");
  if (r.max_concurrency > 0) row("max concurrency", std::to_string(r.max_concurrency));
  row("completed / failed", std::to_string(m.completed) + " / " + std::to_string(m.failed));
  for (const auto& [k, v] : m.failures) row("failed: " + k, std::to_string(v));
  row("duration (s)", fmt("%.2f", m.duration_s));
  row("input / output tokens", std::to_string(m.total_input_tokens) + " / " + std::to_string(m.total_output_tokens));
  row("request throughput (req/s)", fmt("%.3f", m.request_throughput));
  row("input throughput (tok/s)", fmt("%.1f", m.input_throughput));
  row("output throughput (tok/s)", fmt("%.1f", m.output_throughput));
  row("total throughput (tok/s)", fmt("%.1f", m.total_token_throughput));
  if (!slo.empty()) {
    row("goodput (req/s, SLO " + slo.to_string() + ")", fmt("%.3f", m.goodput));
    row("SLO attainment", fmt("%.1f%%", 100.0 * slo_attainment(r)));
  }
  s += "\n| latency (ms) | mean | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n";
  auto lat = [&](const char* name, const Summary& x) {
    char b[256];
    std::snprintf(b, sizeof b, "| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name, x.mean, x.p50, x.p90, x.p99, x.max);
    s += b;
  };
  lat("TTFT", m.ttft_ms);
  lat("TPOT", m.tpot_ms);
  lat("ITL", m.itl_ms);
  lat("E2E latency", m.e2el_ms);
  if (r.server && r.server->any()) {
    const ServerSideMetrics& v = *r.server;
    s += "\n| server-side (/metrics) | client mean (ms) | server mean (ms) | server count |\n|---|---:|---:|---:|\n";
    // client_ms < 0: the client has no counterpart (queue time is only visible to the server).
    auto srv = [&](const char* name, double client_ms, const HistogramDelta& h) {
      const std::string c = client_ms < 0 ? "-" : fmt("%.2f", client_ms);
      const std::string v = h.count > 0 ? fmt("%.2f", h.mean() * 1e3) : "-";
      s += "| " + std::string(name) + " | " + c + " | " + v + " | " + fmt("%.0f", h.count) + " |\n";
    };
    srv("TTFT", m.ttft_ms.mean, v.ttft_s);
    srv("ITL", m.itl_ms.mean, v.itl_s);
    srv("E2E latency", m.e2el_ms.mean, v.e2el_s);
    if (v.queue_s.count > 0) srv("queue time", -1.0, v.queue_s);
    char b[256];
    std::snprintf(b, sizeof b, "| generation tokens | %lld | %.0f | |\n", static_cast<long long>(m.total_output_tokens),
                  v.generation_tokens);
    s += b;
    if (v.prefix_cache_queries > 0)
      s += "| prefix cache hit rate | | " + fmt("%.1f%%", 100.0 * v.prefix_cache_hits / v.prefix_cache_queries) + " | " +
           fmt("%.0f", v.prefix_cache_queries) + " |\n";
    if (v.preemptions > 0) s += "| preemptions | | " + fmt("%.0f", v.preemptions) + " | |\n";
    if (v.busy_seconds > 0 && m.duration_s > 0)
      s += "| engine busy (GPU steps) | | " + fmt("%.1f%% of the run", 100.0 * v.busy_seconds / m.duration_s) +
           " | |\n";
    if (v.spec_drafts > 0)
      s += "| speculative decoding | | " +
           fmt("acceptance %.1f%%", 100.0 * v.spec_accepted_tokens / v.spec_draft_tokens) +
           fmt(", mean accepted length %.2f", 1.0 + v.spec_accepted_tokens / v.spec_drafts) +
           " | " + fmt("%.0f", v.spec_drafts) + " |\n";
  }
  return s;
}

std::optional<double> best_rate_meeting_slo(const std::vector<RunReport>& runs, double attainment_target) {
  std::optional<double> best;
  for (const RunReport& r : runs)
    if (slo_attainment(r) >= attainment_target && (!best || r.request_rate > *best)) best = r.request_rate;
  return best;
}

std::string sweep_markdown(const std::vector<RunReport>& runs, const Slo& slo, std::optional<double> best_rate,
                           double attainment_target) {
  std::string s =
      "| rate (req/s) | completed | failed | req/s | output tok/s | goodput (req/s) | SLO attained | TTFT p99 (ms) | "
      "TPOT p99 (ms) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char b[512];
  for (const RunReport& r : runs) {
    const BenchMetrics& m = r.metrics;
    std::snprintf(b, sizeof b, "| %s | %lld | %lld | %.3f | %.1f | %.3f | %.1f%% | %.2f | %.2f |\n",
                  rate_str(r.request_rate).c_str(), static_cast<long long>(m.completed),
                  static_cast<long long>(m.failed), m.request_throughput, m.output_throughput, m.goodput,
                  100.0 * slo_attainment(r), m.ttft_ms.p99, m.tpot_ms.p99);
    s += b;
  }
  const std::string slo_s = slo.empty() ? "no SLO (every completed request counts)" : "SLO " + slo.to_string();
  if (best_rate)
    s += "\nHighest rate meeting the " + slo_s + " for " + fmt("%g", 100 * attainment_target) +
         "% of requests: " + rate_str(*best_rate) + " req/s\n";
  else
    s += "\nNo rate met the " + slo_s + " for " + fmt("%g", 100 * attainment_target) + "% of requests\n";
  return s;
}

}  // namespace pagellm::bench
