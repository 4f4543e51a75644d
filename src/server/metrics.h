// Prometheus metrics with vLLM's names and meanings (so its dashboards and alerts port), each
// labelled model_name. Engine-side figures (queue lengths, KV usage, prefix cache, token totals,
// tokens per step) come from Engine::stats() at scrape time; per-request latencies are observed
// by the server from the engine's events:
//   arrival (request read) -> scheduled (EngineOutput::scheduled_time) -> first token -> ... ->
//   last token -> done.
//   queue = scheduled - arrival, prefill = first token - scheduled, decode = last - first token,
//   TTFT = first token - arrival, ITL = gap between consecutive tokens of a sequence,
//   e2e = done - arrival.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/finish_reason.h"
#include "runtime/engine.h"
#include "runtime/grammar.h"

namespace pagellm::server {

struct TraceExportStats;  // trace_exporter.h

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket / _sum / _count lines of `name` with `labels` ("model_name=\"x\"").
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// One finished engine request, as the server saw it. Times in seconds; < 0 = did not happen.
struct RequestRecord {
  double e2e = -1;
  double queue = -1;
  double prefill = -1;
  double decode = -1;
  double ttft = -1;
  int32_t prompt_tokens = 0;
  int32_t generation_tokens = 0;
  FinishReason finish = FinishReason::kNone;
};

class ServerMetrics {
 public:
  ServerMetrics(std::string model_name, int32_t max_model_len);

  void observe_request(const RequestRecord& r);
  void observe_inter_token(double seconds);
  void observe_http(int status);
  // A request with a structured-output constraint was admitted.
  void observe_structured_request();

  // The whole exposition (text format 0.0.4). `tracing`: the span exporter's counters, when
  // tracing is on; `grammars`: the grammar compiler's, when the engine has one.
  std::string render(const EngineStats& engine, int64_t n_open_connections,
                     const TraceExportStats* tracing = nullptr,
                     const GrammarCompileStats* grammars = nullptr) const;

 private:
  std::string labels_;  // model_name="..."
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, prompt_tokens_, generation_tokens_;
  uint64_t success_[4] = {0, 0, 0, 0};  // by FinishReason
  uint64_t http_2xx_ = 0, http_4xx_ = 0, http_5xx_ = 0;
  uint64_t structured_requests_ = 0;
};

// Formats a double the way Prometheus expects ("+Inf", shortest round-trip digits).
std::string prom_number(double v);

}  // namespace pagellm::server
