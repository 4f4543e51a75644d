// pagellm serve: the OpenAI-compatible HTTP server (docs/API.md); its options and their meaning
// are in serve_options() below (`pagellm serve --help` prints them).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/log.h"
#include "io/default_model.h"
#include "runtime/engine.h"
#include "runtime/serving_model.h"
#include "server/api_server.h"
#include "tools/args.h"
#include "tools/cli_common.h"

namespace pagellm::cli {
namespace {

// "…/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct": the file name without the
// extension and a trailing quantization tag.
std::string name_from_file(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  const auto dot = name.find_last_of('.');
  if (dot != std::string::npos && dot + 2 < name.size()) {
    const char c = name[dot + 1];
    if ((c == 'Q' || c == 'F' || c == 'B' || c == 'q' || c == 'f') &&
        name.find_first_of("0123456789", dot + 1) != std::string::npos)
      name.resize(dot);
  }
  return name;
}

constexpr const char* kAbout =
    "The OpenAI-compatible HTTP server (docs/API.md): /v1/completions, /v1/chat/completions,\n"
    "/v1/models, /tokenize, /detokenize, /health, /metrics. Prints \"listening on "
    "http://HOST:PORT,\n"
    "model NAME\" once it accepts requests (after the model has loaded). SIGTERM or SIGINT drain:\n"
    "no new connections, requests in flight finish within --drain-timeout, exit 0.\n"
    "  pagellm serve                                  the default model on http://127.0.0.1:8000\n"
    "  pagellm serve --model DIR --device cuda --host 0.0.0.0 --api-key KEY --log-format json\n"
    "  pagellm serve --config serve.yaml              options from a file";

std::vector<OptionGroup> serve_options() {
  return {
      model_options(),
      cache_options(),
      scheduler_options(),
      speculative_options(),
      {"Server",
       {{"host", "ADDR", "address to listen on (0.0.0.0: every interface)", "127.0.0.1"},
        {"port", "PORT", "TCP port; 0 picks a free one (printed)", "8000"},
        {"served-model-name", "NAME", "the model name clients send and /v1/models lists",
         std::nullopt, "--model as given, else the default model's name"},
        {"api-key", "KEY", "require `Authorization: Bearer KEY` on /v1 routes", std::nullopt,
         "none (no authentication)"},
        {"cors-origin", "ORIGIN",
         "answer browsers' CORS requests from these origins (comma-separated, or * for any)",
         std::nullopt, "none (no CORS headers)"},
        {"reasoning-parser", "deepseek_r1|qwen3",
         "return the text between the model's think markers as reasoning_content, apart from "
         "the answer",
         std::nullopt, "none"},
        {"tool-call-parser", "auto|llama3_json|hermes|mistral|deepseek_v3|none",
         "return the tool calls in chat answers to requests with tools as message.tool_calls, "
         "apart from the text; auto: the format whose markers the chat template writes "
         "(docs/API.md), else none",
         "auto"},
        {"max-body-bytes", "BYTES", "largest request body; larger ones get HTTP 413", "8MiB"},
        {"max-connections", "N",
         "most open client connections; past it new ones wait in the kernel's backlog", "8192"},
        {"io-threads", "N", "HTTP I/O threads, at most 256; 0: one per core, up to 4", "0"},
        {"request-timeout", "SECONDS", "abort a request running longer; 0: no limit", "0"},
        {"read-timeout", "SECONDS", "close a connection whose request body stalls this long", "30"},
        {"header-timeout", "SECONDS",
         "close an idle keep-alive connection, or one whose request headers stall, after this long",
         "60"},
        {"drain-timeout", "SECONDS",
         "on SIGTERM, how long requests in flight may take to finish before they are aborted "
         "(keep a pod's terminationGracePeriodSeconds above it)",
         "30"}}},
      {"Observability",
       {{"log-format", "text|json", "log lines as text or as one JSON object each", "text"},
        {"otlp-traces-endpoint",
         "URL",
         "export OpenTelemetry traces (one span per request) over OTLP/HTTP JSON to this URL, "
         "e.g. http://collector:4318/v1/traces; OTEL_EXPORTER_OTLP_ENDPOINT=BASE also works "
         "(BASE/v1/traces)",
         std::nullopt,
         "off",
         {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}},
        {"otlp-service-name",
         "NAME",
         "the traces' service.name",
         "pagellm",
         "",
         {"OTEL_SERVICE_NAME"}},
        {"otlp-max-queue-size",
         "SPANS",
         "spans waiting for export; past it new spans are dropped (and counted), never waited for",
         "2048",
         "",
         {"OTEL_BSP_MAX_QUEUE_SIZE"}},
        {"otlp-max-export-batch-size",
         "SPANS",
         "most spans in one export request",
         "512",
         "",
         {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE"}}}}};
}

}  // namespace

int run_serve(int argc, char** argv) {
  Args a("serve", kAbout, serve_options());
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;
  if (!a.positionals().empty())
    return fail("serve", invalid_argument("unexpected argument '" + a.positionals()[0] +
                                          "' (options start with --; see --help)"));
  const std::string log_format = a.str("log-format");
  if (log_format != "text" && log_format != "json")
    return fail("serve",
                invalid_argument("--log-format must be text or json, got '" + log_format + "'"));
  set_log_format(log_format == "json" ? LogFormat::kJson : LogFormat::kText);

  server::ApiServerConfig c;
  c.http.host = a.str("host");
  auto port = a.get_int("port");
  auto body = a.get_bytes("max-body-bytes");
  auto io = a.get_int("io-threads");
  auto conns = a.get_int("max-connections");
  auto req_to = a.get_double("request-timeout");
  auto drain_to = a.get_double("drain-timeout");
  auto read_to = a.get_double("read-timeout");
  auto header_to = a.get_double("header-timeout");
  for (const Status* s : {&port.status(), &body.status(), &io.status(), &conns.status()})
    if (!s->ok()) return fail("serve", *s);
  for (const Status* s :
       {&req_to.status(), &drain_to.status(), &read_to.status(), &header_to.status()})
    if (!s->ok()) return fail("serve", *s);
  if (*port < 0 || *port > 65535)
    return fail("serve", invalid_argument("--port must be in [0, 65535]"));
  if (*body < 1) return fail("serve", invalid_argument("--max-body-bytes must be positive"));
  if (*io < 0 || *io > 256)
    return fail("serve", invalid_argument("--io-threads must be in [0, 256]"));
  if (*conns < 1) return fail("serve", invalid_argument("--max-connections must be positive"));
  if (*req_to < 0 || *drain_to < 0 || *read_to < 0 || *header_to < 0)
    return fail("serve", invalid_argument("timeouts must be >= 0 seconds"));
  c.http.port = static_cast<uint16_t>(*port);
  c.http.max_body_bytes = *body;
  c.http.io_threads = static_cast<int32_t>(*io);
  c.http.max_connections = static_cast<int32_t>(*conns);
  c.http.request_timeout_s = *req_to;
  c.http.read_timeout_s = *read_to;
  c.http.header_timeout_s = *header_to;
  c.http.cors_origin = a.str("cors-origin");
  c.drain_timeout_s = *drain_to;
  c.api_key = a.str("api-key");
  auto reasoning = server::parse_reasoning_format(a.str("reasoning-parser"));
  if (!reasoning.ok()) return fail("serve", reasoning.status());
  c.reasoning = *reasoning;
  const std::string tool_parser = a.str("tool-call-parser");
  if (tool_parser != "auto") {
    auto tools = server::parse_tool_call_format(tool_parser);
    if (!tools.ok()) return fail("serve", tools.status());
    c.tool_calls = *tools;
  }
  c.tracing.endpoint = a.str("otlp-traces-endpoint");
  if (c.tracing.endpoint.empty()) {
    // The standard base-endpoint variable: traces go to its /v1/traces.
    if (const char* base = std::getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); base && *base) {
      std::string b = base;
      while (!b.empty() && b.back() == '/') b.pop_back();
      c.tracing.endpoint = b + "/v1/traces";
    }
  }
  c.tracing.service_name = a.str("otlp-service-name");
  auto queue = a.get_int("otlp-max-queue-size");
  auto batch = a.get_int("otlp-max-export-batch-size");
  if (!queue.ok()) return fail("serve", queue.status());
  if (!batch.ok()) return fail("serve", batch.status());
  if (*queue < 1 || *batch < 1 || *queue > (1 << 24) || *batch > *queue)
    return fail("serve", invalid_argument("--otlp-max-queue-size must be in [1, 2^24] and "
                                          "--otlp-max-export-batch-size in [1, the queue size]"));
  c.tracing.max_queue_size = static_cast<int32_t>(*queue);
  c.tracing.max_export_batch_size = static_cast<int32_t>(*batch);

  auto sm = load_model_from_args(a);
  if (!sm.ok()) return fail("serve", sm.status());
  ServingModel& m = **sm;
  c.model_path = m.path;
  c.served_model_name = a.has("served-model-name") ? a.str("served-model-name")
                        : a.has("model")           ? a.str("model")
                                                   : name_from_file(m.path);
  if (tool_parser == "auto" && m.chat_template) {
    auto src =
        load_any_chat_template(m.checkpoint.gguf_path.empty() ? m.path : m.checkpoint.gguf_path);
    if (src.ok()) c.tool_calls = server::detect_tool_call_format(src->source);
  }
  PAGELLM_LOG_INFO("tool-call parser: %s%s",
                   std::string(server::tool_call_format_name(c.tool_calls)).c_str(),
                   tool_parser == "auto" ? " (from the chat template)" : "");
  auto engine = make_engine_from_args(a, m);
  if (!engine.ok()) return fail("serve", engine.status());

  server::ApiServer api(c, **engine, m.tokenizer.get(),
                        m.chat_template ? &*m.chat_template : nullptr);
  if (Status s = api.start(); !s.ok()) return fail("serve", s);
  std::printf("listening on http://%s:%u, model %s\n", c.http.host.c_str(), api.port(),
              c.served_model_name.c_str());
  std::fflush(stdout);
  PAGELLM_LOG_INFO("listening on http://%s:%u, model %s", c.http.host.c_str(), api.port(),
                   c.served_model_name.c_str());
  return api.run_until_stopped();
}

}  // namespace pagellm::cli
