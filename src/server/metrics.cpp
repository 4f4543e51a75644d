#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "server/trace_exporter.h"

namespace pagellm::server {
namespace {

// vLLM's bucket boundaries, so histograms from both servers are comparable.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets).
std::vector<double> buckets_1_2_5(int64_t max) {
  std::vector<double> b;
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max) return b;
      b.push_back(static_cast<double>(m * scale));
    }
  }
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + prom_number(v) + "\n";
}

}  // namespace

std::string prom_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i] += 1;
  sum_ += v;
  count_ += 1;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{" + labels + ",le=\"" + prom_number(bounds_[i]) + "\"} " +
           std::to_string(cum) + "\n";
  }
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum{" + labels + "} " + prom_number(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics(std::string model_name, int32_t max_model_len)
    : ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      prefill_(kLatencyBuckets),
      decode_(kLatencyBuckets),
      prompt_tokens_(buckets_1_2_5(std::max(max_model_len, 1))),
      generation_tokens_(buckets_1_2_5(std::max(max_model_len, 1))) {
  // Label values escape backslash, quote and newline.
  std::string v;
  for (char c : model_name) {
    if (c == '\\' || c == '"') v += '\\';
    if (c == '\n') {
      v += "\\n";
      continue;
    }
    v += c;
  }
  labels_ = "model_name=\"" + v + "\"";
}

void ServerMetrics::observe_request(const RequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.e2e >= 0) e2e_.observe(r.e2e);
  if (r.queue >= 0) queue_.observe(r.queue);
  if (r.prefill >= 0) prefill_.observe(r.prefill);
  if (r.decode >= 0) decode_.observe(r.decode);
  if (r.ttft >= 0) ttft_.observe(r.ttft);
  prompt_tokens_.observe(r.prompt_tokens);
  generation_tokens_.observe(r.generation_tokens);
  success_[static_cast<int>(r.finish) & 3] += 1;
}

void ServerMetrics::observe_inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

void ServerMetrics::observe_http(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status >= 500) {
    ++http_5xx_;
  } else if (status >= 400) {
    ++http_4xx_;
  } else {
    ++http_2xx_;
  }
}

void ServerMetrics::observe_structured_request() {
  std::lock_guard<std::mutex> lock(mu_);
  ++structured_requests_;
}

std::string ServerMetrics::render(const EngineStats& es, int64_t n_open_connections,
                                  const TraceExportStats* tracing,
                                  const GrammarCompileStats* grammars) const {
  std::string out;
  out.reserve(16 << 10);
  const std::string& l = labels_;
  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    sample(out, name, l, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    header(out, name, "counter", help);
    sample(out, name, l, v);
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
        es.scheduler.n_running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
        es.scheduler.n_waiting);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
        es.scheduler.kv_usage);
  counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.",
          static_cast<double>(es.scheduler.n_preemptions));
  counter("vllm:prefix_cache_queries_total",
          "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(es.scheduler.prefix.queries));
  counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(es.scheduler.prefix.hits));
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
          static_cast<double>(es.prompt_tokens_total));
  counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
          static_cast<double>(es.generation_tokens_total));
  {
    const std::string name = "vllm:iteration_tokens_total";
    header(out, name, "histogram", "Histogram of number of tokens per engine_step.");
    uint64_t cum = 0, count = 0;
    for (int64_t c : es.iteration_tokens) count += static_cast<uint64_t>(c);
    for (size_t i = 0; i < EngineStats::kIterationTokenBuckets.size(); ++i) {
      cum += static_cast<uint64_t>(es.iteration_tokens[i]);
      out += name + "_bucket{" + l + ",le=\"" +
             prom_number(EngineStats::kIterationTokenBuckets[i]) + "\"} " + std::to_string(cum) +
             "\n";
    }
    out += name + "_bucket{" + l + ",le=\"+Inf\"} " + std::to_string(count) + "\n";
    out += name + "_sum{" + l + "} " + std::to_string(es.iteration_tokens_sum) + "\n";
    out += name + "_count{" + l + "} " + std::to_string(count) + "\n";
  }

  std::lock_guard<std::mutex> lock(mu_);
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    out += "vllm:request_success_total{" + l + ",finished_reason=\"" + finish_reason_name(r) +
           "\"} " + std::to_string(success_[static_cast<int>(r)]) + "\n";
  }
  struct H {
    const char* name;
    const char* help;
    const Histogram& h;
  };
  for (const H& h : {
           H{"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             ttft_},
           H{"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             itl_},
           H{"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             e2e_},
           H{"vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", queue_},
           H{"vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", prefill_},
           H{"vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", decode_},
           H{"vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_},
           H{"vllm:request_generation_tokens", "Number of generation tokens processed.",
             generation_tokens_},
       }) {
    header(out, h.name, "histogram", h.help);
    h.h.render(out, h.name, l);
  }
  header(out, "pagellm:http_responses_total", "counter", "HTTP responses by status class.");
  out += "pagellm:http_responses_total{" + l + ",code=\"2xx\"} " + std::to_string(http_2xx_) + "\n";
  out += "pagellm:http_responses_total{" + l + ",code=\"4xx\"} " + std::to_string(http_4xx_) + "\n";
  out += "pagellm:http_responses_total{" + l + ",code=\"5xx\"} " + std::to_string(http_5xx_) + "\n";
  header(out, "pagellm:http_connections", "gauge", "Open HTTP connections.");
  sample(out, "pagellm:http_connections", l, static_cast<double>(n_open_connections));
  header(out, "pagellm:engine_steps_total", "counter", "Engine steps run.");
  sample(out, "pagellm:engine_steps_total", l, static_cast<double>(es.steps));
  header(out, "pagellm:engine_steps_planned_ahead_total", "counter",
         "Engine steps whose tokens stayed on the device while the next step was queued.");
  sample(out, "pagellm:engine_steps_planned_ahead_total", l,
         static_cast<double>(es.steps_planned_ahead));
  header(out, "pagellm:engine_busy_seconds_total", "counter", "Seconds the engine spent in steps.");
  sample(out, "pagellm:engine_busy_seconds_total", l, es.busy_seconds);
  header(out, "pagellm:engine_host_seconds_total", "counter",
         "Seconds of steps spent on host work with no device work queued.");
  sample(out, "pagellm:engine_host_seconds_total", l, es.host_seconds);
  header(out, "pagellm:kv_cache_blocks", "gauge", "KV-cache blocks in the pool.");
  sample(out, "pagellm:kv_cache_blocks", l, static_cast<double>(es.n_kv_blocks));
  // vLLM's cache configuration as labels of a constant 1: the Gateway API Inference Extension's
  // endpoint picker reads block_size and num_gpu_blocks from it for its prefix-cache scorer.
  header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  sample(out, "vllm:cache_config_info",
         l + ",block_size=\"" + std::to_string(es.kv_block_size) + "\",num_gpu_blocks=\"" +
             std::to_string(es.n_kv_blocks) + "\"",
         1);
  // Structured outputs: requests, grammar compiles (a spec seen before takes the cached grammar)
  // and the host's time making the steps' token masks (per step: its rate over the steps').
  header(out, "pagellm:structured_output_requests_total", "counter",
         "Requests with a structured-output constraint (response_format, guided_*).");
  sample(out, "pagellm:structured_output_requests_total", l,
         static_cast<double>(structured_requests_));
  if (grammars) {
    header(out, "pagellm:grammar_compiles_total", "counter", "Grammars compiled.");
    sample(out, "pagellm:grammar_compiles_total", l, static_cast<double>(grammars->compiled));
    header(out, "pagellm:grammar_cache_hits_total", "counter",
           "Structured-output requests whose grammar was compiled before.");
    sample(out, "pagellm:grammar_cache_hits_total", l, static_cast<double>(grammars->cache_hits));
    header(out, "pagellm:grammar_compile_seconds_total", "counter",
           "Seconds spent compiling grammars.");
    sample(out, "pagellm:grammar_compile_seconds_total", l, grammars->compile_seconds);
  }
  header(out, "pagellm:grammar_mask_steps_total", "counter",
         "Engine steps with grammar-constrained rows.");
  sample(out, "pagellm:grammar_mask_steps_total", l, static_cast<double>(es.grammar_mask_steps));
  header(out, "pagellm:grammar_mask_seconds_total", "counter",
         "Seconds the engine spent making grammar token masks.");
  sample(out, "pagellm:grammar_mask_seconds_total", l, es.grammar_mask_seconds);
  // Speculative decoding, under vLLM's names (present only with a proposer): acceptance rate =
  // accepted / draft tokens, mean accepted length = 1 + accepted / drafts.
  if (!es.spec_accepted_per_position.empty()) {
    header(out, "vllm:spec_decode_num_drafts_total", "counter",
           "Drafts verified (one per sequence and step).");
    sample(out, "vllm:spec_decode_num_drafts_total", l, static_cast<double>(es.spec_drafts));
    header(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.");
    sample(out, "vllm:spec_decode_num_draft_tokens_total", l,
           static_cast<double>(es.spec_draft_tokens));
    header(out, "vllm:spec_decode_num_accepted_tokens_total", "counter",
           "Draft tokens found right.");
    sample(out, "vllm:spec_decode_num_accepted_tokens_total", l,
           static_cast<double>(es.spec_accepted_tokens));
    header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "Draft tokens found right, by their position in the draft.");
    for (size_t j = 0; j < es.spec_accepted_per_position.size(); ++j)
      sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
             l + ",position=\"" + std::to_string(j) + "\"",
             static_cast<double>(es.spec_accepted_per_position[j]));
    header(out, "pagellm:spec_decode_draft_seconds_total", "counter",
           "Seconds the engine spent making drafts.");
    sample(out, "pagellm:spec_decode_draft_seconds_total", l, es.spec_draft_seconds);
  }
  if (tracing) {
    header(out, "pagellm:trace_spans_exported_total", "counter",
           "Trace spans the OTLP collector accepted.");
    sample(out, "pagellm:trace_spans_exported_total", l, static_cast<double>(tracing->exported));
    header(out, "pagellm:trace_spans_dropped_total", "counter",
           "Trace spans dropped: the export queue was full, or their batch failed for good.");
    out += "pagellm:trace_spans_dropped_total{" + l + ",reason=\"queue_full\"} " +
           std::to_string(tracing->dropped_queue) + "\n";
    out += "pagellm:trace_spans_dropped_total{" + l + ",reason=\"export_failed\"} " +
           std::to_string(tracing->dropped_export) + "\n";
  }
  return out;
}

}  // namespace pagellm::server
