// ApiServer: the OpenAI-compatible API over one Engine.
//   POST /v1/completions  POST /v1/chat/completions  GET /v1/models[/{id}]
//   GET /health  GET /version  GET /metrics  POST /tokenize  POST /detokenize
// It parses and validates requests (openai_protocol.h), applies the chat template, tokenizes,
// submits to the engine, and turns the engine's events into JSON responses or SSE streams.
// Engine callbacks arrive on the engine thread and are only posted to the connection's strand;
// all response work happens there. Docs: docs/API.md, docs/openapi.yaml.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>

#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"
#include "server/trace_exporter.h"
#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::server {

struct ApiServerConfig {
  HttpServerConfig http;
  std::string served_model_name = "default";
  std::string model_path;       // reported as the model's "root" in /v1/models
  std::string api_key;          // "" = no authentication
  double drain_timeout_s = 30;  // SIGTERM: how long in-flight requests may take to finish
  // --reasoning-parser: chat answers' thought returned as reasoning_content, apart from content.
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // --tool-call-parser: the calls in chat answers to requests with `tools` (and tool_choice not
  // "none") returned as message.tool_calls, apart from content; kNone: answers stay text.
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  // OpenTelemetry traces (OTLP/HTTP JSON): one span per completions / chat request. Off while
  // tracing.endpoint is "".
  TracingConfig tracing;
};

class ApiServer {
 public:
  // `tokenizer` and `chat_template` may be null (token-id completions only).
  ApiServer(ApiServerConfig config, Engine& engine, const Tokenizer* tokenizer,
            const ChatTemplate* chat_template);
  ~ApiServer();

  // Starts the trace exporter (when configured; a bad endpoint is an error here) and listens; the
  // server answers requests from here on.
  Status start();
  uint16_t port() const { return http_->port(); }

  // Blocks until SIGINT/SIGTERM (or request_stop()), then drains: stops accepting, lets requests
  // in flight finish for up to drain_timeout_s, aborts the rest, stops the engine and the I/O
  // threads. A second signal skips the rest of the drain. Returns 0.
  int run_until_stopped();
  void request_stop();

  // Used by the handlers (public for the per-request state in api_server.cpp).
  Engine& engine() { return engine_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  // Where a constrained chat answer's grammar starts with --reasoning-parser on: after the
  // thought (its markers' token ids); nullopt without a parser or single-token markers.
  std::optional<EngineRequest::Thinking> grammar_thinking() const { return thinking_; }
  ServerMetrics& metrics() { return metrics_; }
  const ApiServerConfig& config() const { return config_; }
  void track(uint64_t engine_id);
  void untrack(uint64_t engine_id);
  // Tracing: the span of a request (null when tracing is off, or the caller's traceparent says
  // not sampled), and its end: HTTP attributes, times, status, then queued for export.
  std::unique_ptr<Span> start_span(const Exchange& ex) const;
  void end_span(std::unique_ptr<Span> span, const Exchange& ex, const ApiError* error);

 private:
  void handle(std::shared_ptr<Exchange> ex);
  // handle_generate parses and validates a completions / chat request; a structured-output
  // request whose grammar is not built yet then waits for it on grammar_pool_, and
  // start_generation goes on from there: template, tokens, limits, then the engine.
  void handle_generate(const std::shared_ptr<Exchange>& ex, bool chat);
  void start_generation(const std::shared_ptr<Exchange>& ex, bool chat, GenerateRequest req,
                             std::unique_ptr<Span> span);
  // A request refused: the error response, counted, and its span ended.
  void refuse(Exchange& ex, std::unique_ptr<Span> span, const ApiError& e, Headers extra = {});
  void handle_models(const std::shared_ptr<Exchange>& ex, const std::string& id);
  void handle_tokenize(const std::shared_ptr<Exchange>& ex);
  void handle_detokenize(const std::shared_ptr<Exchange>& ex);
  bool authorized(const HttpRequest& r) const;
  std::optional<ApiError> check_model(const std::string& model) const;
  void abort_all();
  int64_t n_tracked() const;
  void wait_signal();

  ApiServerConfig config_;
  Engine& engine_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  ServerMetrics metrics_;
  int64_t created_ = 0;                    // unix time the server started (the model's "created")
  std::optional<EngineRequest::Thinking> thinking_;
  std::unique_ptr<TraceExporter> tracer_;  // null: tracing off. Outlives http_'s handlers.
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<boost::asio::signal_set> signals_;  // destroyed before http_ (its I/O context)
  // Grammar compiles (seconds for a large schema over a large vocabulary) run here, never on an
  // I/O thread, whose other connections would stall meanwhile. Joined before http_ goes.
  boost::asio::thread_pool grammar_pool_{2};

  mutable std::mutex live_mu_;
  std::unordered_set<uint64_t> live_;  // engine request ids in flight
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  int n_stop_requests_ = 0;
};

// Sends a JSON error response and counts it.
void reply_error(ServerMetrics& metrics, Exchange& ex, const ApiError& e, Headers extra = {});

}  // namespace pagellm::server
