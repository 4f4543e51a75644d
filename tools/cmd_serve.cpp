// pagellm serve: the OpenAI-compatible HTTP server (docs/API.md).
//   pagellm serve                                   default model on http://127.0.0.1:8000
//   pagellm serve --model DIR --host 0.0.0.0 --port 8080 --api-key KEY --log-format json
// Every option is also read from PAGELLM_<OPTION> (e.g. PAGELLM_PORT=8080). Prints one line to
// stdout when it accepts requests: "listening on http://HOST:PORT, model NAME". SIGTERM / SIGINT
// drain (no new connections, requests in flight finish within --drain-timeout) and exit 0.
#include <cstdio>
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
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  const auto dot = name.find_last_of('.');
  if (dot != std::string::npos && dot + 2 < name.size()) {
    const char c = name[dot + 1];
    if ((c == 'Q' || c == 'F' || c == 'B' || c == 'q' || c == 'f') &&
        name.find_first_of("0123456789", dot + 1) != std::string::npos)
      name.resize(dot);
  }
  return name;
}

}  // namespace

int run_serve(int argc, char** argv) {
  std::vector<std::string> spec = {"host",
                                   "port",
                                   "served-model-name",
                                   "api-key",
                                   "max-body-bytes",
                                   "request-timeout",
                                   "drain-timeout",
                                   "cors-origin",
                                   "log-format",
                                   "io-threads",
                                   "read-timeout",
                                   "header-timeout",
                                   "max-connections",
                                   "reasoning-parser",
                                   "help!"};
  add_model_options(spec);
  Args a("serve", spec);
  if (Status s = a.parse(argc, argv); !s.ok()) return fail("serve", s);
  if (a.flag("help")) {
    std::printf("%s\n", a.usage().c_str());
    return 0;
  }
  const std::string log_format = a.get_or("log-format", "text");
  if (log_format != "text" && log_format != "json")
    return fail("serve", invalid_argument("--log-format must be text or json, got '" + log_format + "'"));
  set_log_format(log_format == "json" ? LogFormat::kJson : LogFormat::kText);

  server::ApiServerConfig c;
  c.http.host = a.get_or("host", "127.0.0.1");
  auto port = a.get_int("port", 8000);
  auto body = a.get_int("max-body-bytes", 8 << 20);
  auto io = a.get_int("io-threads", 0);
  auto conns = a.get_int("max-connections", 8192);
  auto req_to = a.get_double("request-timeout", 0);
  auto drain_to = a.get_double("drain-timeout", 30);
  auto read_to = a.get_double("read-timeout", 30);
  auto header_to = a.get_double("header-timeout", 60);
  for (const Status* s : {&port.status(), &body.status(), &io.status(), &conns.status()})
    if (!s->ok()) return fail("serve", *s);
  for (const Status* s : {&req_to.status(), &drain_to.status(), &read_to.status(), &header_to.status()})
    if (!s->ok()) return fail("serve", *s);
  if (*port < 0 || *port > 65535) return fail("serve", invalid_argument("--port must be in [0, 65535]"));
  if (*body < 1) return fail("serve", invalid_argument("--max-body-bytes must be positive"));
  if (*io < 0 || *io > 256) return fail("serve", invalid_argument("--io-threads must be in [0, 256]"));
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
  c.http.cors_origin = a.get_or("cors-origin", "");
  c.drain_timeout_s = *drain_to;
  c.api_key = a.get_or("api-key", "");
  auto reasoning = server::parse_reasoning_format(a.get_or("reasoning-parser", ""));
  if (!reasoning.ok()) return fail("serve", reasoning.status());
  c.reasoning = *reasoning;

  auto sm = load_model_from_args(a);
  if (!sm.ok()) return fail("serve", sm.status());
  ServingModel& m = **sm;
  c.model_path = m.path;
  c.served_model_name = a.get_or("served-model-name", a.has("model") ? *a.get("model") : name_from_file(m.path));
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
