// TraceExporter: sends finished spans to an OpenTelemetry collector over OTLP/HTTP with JSON
// bodies (POST to the traces URL, Content-Type application/json), in batches, from one background
// thread, so that tracing never waits on the network in a request's path.
//
//   request path (I/O threads):  submit(span) -> bounded queue (full: the span is dropped and
//                                counted; nothing blocks beyond a short mutex)
//   exporter thread:             wakes when a batch is full or schedule_delay_s has passed, encodes
//                                up to max_export_batch_size spans and POSTs them; 429/502/503/504,
//                                a failed connection or no response are retried (Retry-After or
//                                exponential backoff with jitter, max_retries times), other
//                                statuses drop the batch. Failures are logged at most every 30 s.
//   shutdown(limit):             exports what is queued, then stops; what is left at the limit is
//                                dropped (counted).
//
// Only http:// endpoints: TLS would need OpenSSL in the build and its certificate handling; an
// https:// endpoint is refused at start-up (send to a local collector, which can forward over TLS).
// The retry rules are opentelemetry-proto's docs/specification.md ("OTLP/HTTP Throttling",
// "Retryable Response Codes"); the batching defaults follow the SDKs' BatchSpanProcessor
// (OTEL_BSP_*), except the delay: 1 s, not 5 s, so spans show up while someone is looking.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "server/tracing.h"

namespace pagellm::server {

struct TracingConfig {
  // The OTLP/HTTP traces URL, used as given (as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is), e.g.
  // http://collector:4318/v1/traces. "" = tracing off: no thread, no per-request work.
  std::string endpoint;
  std::string service_name = "pagellm";  // the resource's service.name (OTEL_SERVICE_NAME)
  int32_t max_queue_size = 2048;         // spans waiting for export; beyond it new ones are dropped
  int32_t max_export_batch_size = 512;   // spans per POST
  double schedule_delay_s = 1.0;         // the longest a span waits for its batch
  double export_timeout_s = 10.0;        // one POST: connect, send, response
  int32_t max_retries = 5;               // per batch, after the first try
  double initial_backoff_s = 0.5;        // doubled per retry (with +-20% jitter), at most:
  double max_backoff_s = 8.0;
  double shutdown_timeout_s = 5.0;  // the final flush at shutdown
};

// An endpoint URL split for the HTTP client.
struct OtlpEndpoint {
  std::string host;    // name or address, brackets removed from IPv6 literals
  std::string port;    // as given, or "80" (http's) when the URL has none
  std::string target;  // path and query, "/" when empty
  std::string host_header;
};

// Parses an http:// URL. https:// and anything malformed is an error that names the flag.
Result<OtlpEndpoint> parse_otlp_endpoint(const std::string& url);

struct TraceExportStats {
  int64_t exported = 0;        // spans the collector accepted (a 2xx answer)
  int64_t dropped_queue = 0;   // spans dropped because the queue was full (or at shutdown)
  int64_t dropped_export = 0;  // spans in batches that failed for good
};

class OtlpHttpClient;

class TraceExporter {
 public:
  // Validates the endpoint and starts the exporter thread.
  static Result<std::unique_ptr<TraceExporter>> create(const TracingConfig& config,
                                                       const std::string& version);
  ~TraceExporter();  // shutdown(config.shutdown_timeout_s) if not done yet

  // Queues a finished span for export; never blocks on the network. Thread-safe.
  void submit(Span&& span);

  // Exports what is queued (in batches, retrying as usual) for at most `timeout_s`, then stops the
  // thread. Spans submitted afterwards are dropped. Idempotent.
  void shutdown(double timeout_s);

  TraceExportStats stats() const;
  const TracingConfig& config() const { return config_; }

 private:
  TraceExporter(TracingConfig config, OtlpEndpoint endpoint, TraceResource resource);
  void run();
  // POSTs one batch, retrying as the specification says; false if the batch was given up.
  bool export_batch(std::vector<Span>& batch);
  // The limit of the current work: the shutdown deadline once shutdown() began, else none.
  std::chrono::steady_clock::time_point deadline() const;
  // Waits `d` before a retry; false (at once) when the shutdown deadline comes first.
  bool backoff_wait(std::chrono::steady_clock::duration d);
  void log_failure(const std::string& what);

  TracingConfig config_;
  OtlpEndpoint endpoint_;
  TraceResource resource_;
  std::unique_ptr<OtlpHttpClient> client_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // the exporter thread waits here
  std::deque<Span> queue_;
  bool stopping_ = false;  // shutdown() called: flush and stop
  std::chrono::steady_clock::time_point stop_deadline_{};
  bool shut_down_ = false;

  std::atomic<int64_t> exported_{0};
  std::atomic<int64_t> dropped_queue_{0};
  std::atomic<int64_t> dropped_export_{0};

  // Exporter thread only: log rate limiting.
  std::chrono::steady_clock::time_point last_log_{};
  int64_t n_unlogged_failures_ = 0;

  std::thread thread_;
};

}  // namespace pagellm::server
