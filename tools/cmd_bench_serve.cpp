// pagellm bench serve: an open-loop load generator against any OpenAI-compatible server (this
// one, vLLM, SGLang, llama.cpp's llama-server); see docs/BENCHMARKS.md for the method.
// pagellm bench cost: a report's throughput in $ per million tokens, from bench/prices.toml.
#include "tools/cmd_bench_serve.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "bench/arrival.h"
#include "bench/client.h"
#include "bench/cost.h"
#include "bench/prometheus.h"
#include "bench/report.h"
#include "bench/workload.h"
#include "tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/cli_common.h"

namespace pagellm::cli {
namespace {

using namespace pagellm::bench;

Result<double> parse_rate(const std::string& s) {
  if (s == "inf" || s == "INF" || s == "Inf") return std::numeric_limits<double>::infinity();
  char* e = nullptr;
  const double r = std::strtod(s.c_str(), &e);
  if (s.empty() || *e || !(r > 0) || !std::isfinite(r))
    return invalid_argument("request rate '" + s + "' must be a positive number or inf");
  return r;
}

Result<std::vector<double>> parse_rates(const std::string& list) {
  std::vector<double> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto r = parse_rate(item);
    if (!r.ok()) return Status(r.status().code(), "--sweep-rate: " + r.status().message());
    out.push_back(*r);
  }
  if (out.empty()) return invalid_argument("--sweep-rate needs at least one rate");
  return out;
}

// A child `pagellm serve` on a free loopback port, stopped (SIGTERM, then SIGKILL) on scope exit.
class ChildServer {
 public:
  ~ChildServer() { stop(); }

  Status start(const std::string& model, const std::string& device, double wait_s) {
    unsigned short port = 0;
    {
      boost::asio::io_context ioc;
      boost::asio::ip::tcp::acceptor a(
          ioc, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
      port = a.local_endpoint().port();
    }
    url_ = "http://127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {"pagellm",   "serve",  "--host",
                                     "127.0.0.1", "--port", std::to_string(port)};
    if (!model.empty()) args.insert(args.end(), {"--model", model});
    if (!device.empty()) args.insert(args.end(), {"--device", device});
    pid_ = fork();
    if (pid_ < 0) return internal_error("fork failed: cannot start pagellm serve");
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& s : args) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    std::fprintf(stderr, "bench serve: started pagellm serve (pid %d) at %s\n",
                 static_cast<int>(pid_), url_.c_str());
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return internal_error("pagellm serve exited before it was healthy (see its log above)");
      }
      if (http_get(url_, "/health", 2).ok()) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return internal_error("pagellm serve was not healthy at " + url_ +
                          "/health within --server-start-timeout");
  }

  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {  // 10 s to drain
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  const std::string& url() const { return url_; }

 private:
  pid_t pid_ = -1;
  std::string url_;
};

Result<std::string> first_model_id(const std::string& base_url, double timeout_s) {
  auto body = http_get(base_url, "/v1/models", timeout_s);
  if (!body.ok()) return body.status();
  const auto j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return invalid_argument(base_url + "/v1/models lists no model: pass --model");
  return j["data"][0]["id"].get<std::string>();
}

std::optional<PromSamples> scrape(const std::string& url) {
  auto text = http_get(url, "/metrics", 10);
  if (!text.ok()) return std::nullopt;
  auto s = parse_prometheus(*text);
  if (!s.ok()) {
    std::fprintf(stderr, "bench serve: ignoring /metrics: %s\n", s.status().message().c_str());
    return std::nullopt;
  }
  return *s;
}

}  // namespace

int bench_serve(int argc, char** argv) {
  const char* kCmd = "bench serve";
  Args a(
      kCmd,
      "Open-loop load against an OpenAI-compatible server (this one, vLLM, SGLang, llama.cpp's\n"
      "llama-server): requests sent on an arrival schedule whatever the server's pace; TTFT,\n"
      "TPOT, ITL and E2E latency percentiles, throughput and goodput per rate; the method is in\n"
      "docs/BENCHMARKS.md. Without --base-url it starts `pagellm serve` on a free loopback port.\n"
      "  pagellm bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 4 "
      "\\\n"
      "      --input-len 512 --output-len 128 --slo ttft=500,tpot=30 --output-json run.json",
      {{"Server",
        {{"base-url", "URL", "the server to load", std::nullopt,
          "start `pagellm serve` with --model and --device"},
         {"endpoint", "PATH", "/v1/completions or /v1/chat/completions", "/v1/completions"},
         {"model", "NAME|DIR",
          "with --base-url: the model name to send; without: the model the started server loads",
          std::nullopt, "the first model /v1/models lists"},
         {"served-model-name", "NAME", "the model name requests carry, whatever --model is",
          std::nullopt, "see --model"},
         {"device", "cpu|cuda", "the started server's device", std::nullopt,
          "the server's default"},
         {"api-key", "KEY", "sent as `Authorization: Bearer KEY`", std::nullopt, "none"},
         {"server-start-timeout", "SECONDS", "how long to wait for a started server's /health",
          "600"}}},
       {"Arrivals",
        {{"request-rate", "RATE", "requests per second; inf sends every request at once", "inf"},
         {"sweep-rate", "RATES",
          "run the workload at each of these rates (comma-separated, inf allowed) and report "
          "the highest that meets --slo",
          std::nullopt, "one run at --request-rate"},
         {"arrival", "poisson|gamma|mix", "the inter-arrival distribution (docs/BENCHMARKS.md)",
          std::nullopt, "gamma with --burstiness, else poisson"},
         {"burstiness", "K", "gamma shape: < 1 burstier, > 1 smoother than Poisson", "1.0"},
         {"mix-heavy-fraction", "F", "mix: the share of Pareto gaps", "0.2"},
         {"mix-pareto-alpha", "A", "mix: the Pareto tail index", "1.5"},
         {"max-concurrency", "N",
          "most requests in flight; later arrivals wait in order; 0: no cap", "0"},
         {"num-warmups", "N", "requests sent one at a time before the runs, not measured", "0"},
         {"seed", "N", "seed of the schedules and the random prompts", "0"}}},
       {"Workload",
        {{"num-prompts", "N", "requests per run", "100"},
         {"dataset-name", "random|shared-prefix|sharegpt", "where prompts come from", "random"},
         {"dataset-path", "FILE", "sharegpt: the ShareGPT JSON file", std::nullopt, "none"},
         {"input-len", "TOKENS", "prompt tokens (random datasets)", "1024"},
         {"output-len", "TOKENS",
          "max_tokens of each request (sharegpt: overrides the dataset's answer lengths)", "128"},
         {"input-len-dist", "DIST",
          "prompt lengths around --input-len: fixed, uniform:LO,HI or lognormal:SIGMA", "fixed"},
         {"output-len-dist", "DIST", "output lengths around --output-len, as --input-len-dist",
          "fixed"},
         {"random-vocab-size", "N", "random prompts' token ids are in [100, N)", "1000"},
         {"num-prefixes", "N", "shared-prefix: distinct long system prompts", "4"},
         {"prefix-len", "TOKENS", "shared-prefix: tokens of each system prompt", std::nullopt,
          "--input-len"},
         {"tokenizer", "PATH",
          "count text datasets' tokens with this tokenizer (tokenizer.json, .model, .gguf or a "
          "model folder)",
          std::nullopt, "an estimate from the text's length"},
         {"no-ignore-eos", "",
          "let requests stop at end of sequence (by default they run to max_tokens)"},
         {"extra-body", "JSON", "a JSON object merged into every request body", std::nullopt,
          "none"},
         {"keep-alive", "", "reuse connections (by default each request opens its own)"},
         {"timeout", "SECONDS", "a request's deadline", "600"},
         {"stall-timeout", "SECONDS", "fail a request that receives no byte this long", "60"}}},
       {"Report",
        {{"slo", "ttft=MS,tpot=MS[,e2el=MS]", "bounds a request must meet to count as goodput",
          std::nullopt, "none"},
         {"slo-attainment", "F", "a sweep's rate passes when this share of requests meets --slo",
          "0.9"},
         {"output-json", "FILE", "also write the report as JSON", std::nullopt, "none"},
         {"save-requests", "", "put every request's timings into the JSON report"},
         {"no-metrics", "", "do not scrape the server's /metrics before and after each run"},
         {"gpu", "NAME", "tag the report with the GPU (for bench cost)", std::nullopt, "none"},
         {"precision", "NAME", "tag the report with the weights' precision (for bench cost)",
          std::nullopt, "none"}}}});
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;

  auto n = a.get_int("num-prompts"), in = a.get_int("input-len"), out = a.get_int("output-len");
  auto seed = a.get_int("seed"), cap = a.get_int("max-concurrency");
  auto vocab = a.get_int("random-vocab-size"), n_pre = a.get_int("num-prefixes");
  auto burst = a.get_double("burstiness"), timeout = a.get_double("timeout");
  auto stall = a.get_double("stall-timeout"), attain = a.get_double("slo-attainment");
  auto heavy = a.get_double("mix-heavy-fraction"), alpha = a.get_double("mix-pareto-alpha");
  auto start_wait = a.get_double("server-start-timeout");
  for (const Status* s :
       {&n.status(), &in.status(), &out.status(), &seed.status(), &cap.status(), &vocab.status(),
        &n_pre.status(), &burst.status(), &timeout.status(), &stall.status(), &attain.status(),
        &heavy.status(), &alpha.status(), &start_wait.status()})
    if (!s->ok()) return fail(kCmd, *s);
  auto prefix_len = a.has("prefix-len") ? a.get_int("prefix-len") : Result<int64_t>(*in);
  if (!prefix_len.ok()) return fail(kCmd, prefix_len.status());
  if (*n < 1 || *cap < 0)
    return fail(kCmd, invalid_argument("--num-prompts >= 1 and --max-concurrency >= 0"));
  if (!(*attain > 0 && *attain <= 1))
    return fail(kCmd, invalid_argument("--slo-attainment must be in (0, 1]"));

  Slo slo;
  if (auto v = a.get("slo")) {
    auto s = parse_slo(*v);
    if (!s.ok()) return fail(kCmd, s.status());
    slo = *s;
  }
  auto arrival_kind = parse_arrival_kind(a.has("arrival")      ? a.str("arrival")
                                         : a.has("burstiness") ? "gamma"
                                                               : "poisson");
  if (!arrival_kind.ok()) return fail(kCmd, arrival_kind.status());
  std::vector<double> rates;
  if (auto sw = a.get("sweep-rate")) {
    auto r = parse_rates(*sw);
    if (!r.ok()) return fail(kCmd, r.status());
    rates = *r;
  } else {
    auto r = parse_rate(a.str("request-rate"));
    if (!r.ok())
      return fail(kCmd, Status(r.status().code(), "--request-rate: " + r.status().message()));
    rates = {*r};
  }

  // The workload: each rate of a sweep draws its own prompts (bench/workload.h says why); run 0's
  // is made now so that a bad dataset fails before any server starts.
  auto in_dist = parse_length_dist(a.str("input-len-dist"), *in, "--input-len-dist");
  auto out_dist = parse_length_dist(a.str("output-len-dist"), *out, "--output-len-dist");
  if (!in_dist.ok()) return fail(kCmd, in_dist.status());
  if (!out_dist.ok()) return fail(kCmd, out_dist.status());
  WorkloadSpec ws;
  ws.random.n = *n;
  ws.random.input = *in_dist;
  ws.random.output = *out_dist;
  ws.random.vocab_size = *vocab;
  ws.random.seed = static_cast<uint64_t>(*seed);
  ws.dataset = a.str("dataset-name");
  ws.path = a.str("dataset-path");
  ws.n_prefixes = *n_pre;
  ws.prefix_len = *prefix_len;
  ws.fixed_output_len = a.has("output-len") ? *out : 0;
  ws.default_max_tokens = *out;
  const std::string& dataset = ws.dataset;
  // Text datasets: expected lengths by a real tokenizer when one is given, else estimated.
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto tp = a.get("tokenizer")) {
    auto t = load_tokenizer(*tp);
    if (!t.ok()) return fail(kCmd, t.status());
    tokenizer = std::move(*t);
    ws.count_tokens = [&tokenizer](std::string_view text) -> int64_t {
      auto ids = tokenizer->encode(text, /*add_special_tokens=*/false);
      return ids.ok() ? static_cast<int64_t>(ids->size()) : estimate_tokens(text);
    };
  }
  auto first_workload = make_workload(ws, 0);
  if (!first_workload.ok()) return fail(kCmd, first_workload.status());

  // The server: given, or a child `pagellm serve`.
  ChildServer child;
  ClientOptions co;
  if (auto url = a.get("base-url")) {
    co.base_url = *url;
  } else {
    if (Status s = child.start(a.str("model"), a.str("device"), *start_wait); !s.ok())
      return fail(kCmd, s);
    co.base_url = child.url();
  }
  co.path = a.str("endpoint");
  co.timeout_s = *timeout;
  co.stall_timeout_s = *stall;
  co.keep_alive = a.flag("keep-alive");
  co.max_concurrency = *cap;
  co.ignore_eos = !a.flag("no-ignore-eos");
  co.api_key = a.str("api-key");
  if (auto eb = a.get("extra-body")) {
    co.extra_body = nlohmann::json::parse(*eb, nullptr, false);
    if (co.extra_body.is_discarded() || !co.extra_body.is_object())
      return fail(kCmd, invalid_argument("--extra-body must be a JSON object"));
  }
  // The model name the requests carry: --served-model-name, else --model when a server was given,
  // else the first one the server lists.
  if (auto name = a.get("served-model-name"))
    co.model = *name;
  else if (a.has("base-url") && a.has("model"))
    co.model = a.str("model");
  else {
    auto id = first_model_id(co.base_url, 30);
    if (!id.ok()) return fail(kCmd, id.status());
    co.model = *id;
  }

  // Every request in flight holds a socket: allow as many as the hard limit permits.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Warm-up requests, one at a time and not measured: a cold server's first requests pay for lazy
  // allocation, page faults and caches that no later request sees.
  auto n_warm = a.get_int("num-warmups");
  if (!n_warm.ok() || *n_warm < 0)
    return fail(kCmd, invalid_argument("--num-warmups must be >= 0"));
  // Their TTFTs are kept for the report: against the measured runs' TTFT they show how much slower
  // a freshly started server's first requests are (none, when start-up warms everything up).
  std::vector<double> warmup_ttft_ms;
  if (*n_warm > 0) {
    // Warm-up prompts come from a run index no measured run uses: a warm-up that sent a measured
    // prompt would leave it in the prefix cache.
    auto warm_workload = make_workload(ws, static_cast<int64_t>(rates.size()));
    if (!warm_workload.ok()) return fail(kCmd, warm_workload.status());
    const std::vector<BenchRequest>& pool = warm_workload->requests;
    std::vector<BenchRequest> warm;
    for (int64_t i = 0; i < *n_warm; ++i)
      warm.push_back(pool[static_cast<size_t>(i) % pool.size()]);
    ClientOptions wo = co;
    wo.max_concurrency = 1;
    auto w = run_load(wo, warm, std::vector<double>(warm.size(), 0.0));
    if (!w.ok()) return fail(kCmd, w.status());
    int64_t n_ok = 0;
    for (const RequestResult& q : w->results) {
      n_ok += q.ok;
      if (q.ok) warmup_ttft_ms.push_back(q.ttft_s * 1e3);
    }
    std::string ttfts;
    for (double t : warmup_ttft_ms)
      ttfts += (ttfts.empty() ? "" : ", ") + std::to_string(static_cast<int64_t>(t + 0.5));
    std::fprintf(stderr, "bench serve: %lld warm-up requests, %lld succeeded (TTFT ms: %s)\n",
                 static_cast<long long>(*n_warm), static_cast<long long>(n_ok), ttfts.c_str());
  }

  std::vector<RunReport> runs;
  bool prompts_repeat = false;  // a dataset too small to give every rate its own entries
  for (size_t run_index = 0; run_index < rates.size(); ++run_index) {
    const double rate = rates[run_index];
    Result<Workload> workload = run_index == 0 ? std::move(first_workload)
                                               : make_workload(ws, static_cast<int64_t>(run_index));
    if (!workload.ok()) return fail(kCmd, workload.status());
    if (rates.size() > 1 && workload->reuses_entries) {
      prompts_repeat = true;
      std::fprintf(
          stderr,
          "bench serve: %s holds %lld requests, fewer than the %lld that %zu rates of %lld need: "
          "this rate repeats prompts an earlier run sent (prefix-cache hits may flatter it)\n",
          ws.path.c_str(), static_cast<long long>(workload->pool_size),
          static_cast<long long>(*n) * static_cast<long long>(rates.size()), rates.size(),
          static_cast<long long>(*n));
    }
    const std::vector<BenchRequest>& reqs = workload->requests;
    ArrivalOptions ao;
    ao.kind = *arrival_kind;
    ao.rate = rate;
    ao.burstiness = *burst;
    ao.heavy_fraction = *heavy;
    ao.pareto_alpha = *alpha;
    ao.seed = static_cast<uint64_t>(*seed);
    auto times = arrival_times(ao, *n);
    if (!times.ok()) return fail(kCmd, times.status());
    char rate_s[32] = "inf";
    if (!std::isinf(rate)) std::snprintf(rate_s, sizeof rate_s, "%g", rate);
    std::string source = "workload seed " + std::to_string(workload->seed);
    if (workload->first >= 0) source += ", from entry " + std::to_string(workload->first);
    std::fprintf(stderr, "bench serve: %lld requests at %s req/s (%s) to %s%s, model %s, %s\n",
                 static_cast<long long>(*n), rate_s, arrival_kind_name(ao.kind),
                 co.base_url.c_str(), co.path.c_str(), co.model.c_str(), source.c_str());
    std::optional<PromSamples> before = a.flag("no-metrics") ? std::nullopt : scrape(co.base_url);
    auto res = run_load(co, reqs, *times);
    if (!res.ok()) return fail(kCmd, res.status());
    RunReport r;
    r.request_rate = rate;
    r.arrival = arrival_kind_name(ao.kind);
    r.burstiness = *burst;
    r.max_concurrency = *cap;
    r.num_prompts = *n;
    r.workload_seed = workload->seed;
    r.dataset_first = workload->first;
    r.metrics = compute_metrics(res->results, res->duration_s, slo);
    if (before) {
      if (auto after = scrape(co.base_url)) r.server = server_side_metrics(*before, *after);
    }
    // The first failure of each kind, so a failed run says why.
    std::map<std::string, std::string> first;
    for (const RequestResult& q : res->results)
      if (!q.ok && !first.count(q.error_kind)) first[q.error_kind] = q.error_detail;
    for (const auto& [k, d] : first)
      std::fprintf(stderr, "bench serve: %s: %s\n", k.c_str(), d.c_str());
    r.requests = std::move(res->results);
    std::printf("%s\n", run_markdown(r, slo).c_str());
    runs.push_back(std::move(r));
  }
  std::optional<double> best;
  if (runs.size() > 1) {
    best = best_rate_meeting_slo(runs, *attain);
    std::printf("%s\n", sweep_markdown(runs, slo, best, *attain).c_str());
    std::printf(
        "%s\n",
        prompts_repeat
            ? "Some rates repeated prompts of earlier rates: the dataset is too small for "
              "--num-prompts per rate."
            : "Each rate sent its own prompts (workload seed or dataset entries derived from "
              "--seed and the rate's index), so no rate ran against a prefix cache that "
              "an earlier rate had warmed.");
  }

  if (auto path = a.get("output-json")) {
    // The top level carries the single run's figures (or, for a sweep, those of the best rate
    // meeting the SLO, else the last rate), so every report reads the same way.
    const RunReport& head = [&]() -> const RunReport& {
      if (best)
        for (const RunReport& r : runs)
          if (r.request_rate == *best) return r;
      return runs.back();
    }();
    nlohmann::json j = run_json(head, slo, false);
    j["schema"] = kReportSchema;
    j["base_url"] = co.base_url;
    j["endpoint"] = co.path;
    j["model"] = co.model;
    j["dataset"] = dataset;
    j["input_len"] = *in;
    j["output_len"] = *out;
    j["input_len_dist"] = a.str("input-len-dist");
    j["output_len_dist"] = a.str("output-len-dist");
    j["seed"] = *seed;
    j["keep_alive"] = co.keep_alive;
    if (auto g = a.get("gpu")) j["gpu"] = *g;
    if (auto p = a.get("precision")) j["precision"] = *p;
    // One at a time on a freshly started (or idle) server: the first is the cold-start TTFT.
    if (!warmup_ttft_ms.empty()) j["warmup_ttft_ms"] = warmup_ttft_ms;
    j["runs"] = nlohmann::json::array();
    for (const RunReport& r : runs) j["runs"].push_back(run_json(r, slo, a.flag("save-requests")));
    if (runs.size() > 1) {
      j["max_rate_meeting_slo"] = best ? nlohmann::json(*best) : nlohmann::json(nullptr);
      // Each run's own prompts: "workload_seed" (and "dataset_first") in every run object.
      j["distinct_prompts_per_rate"] = !prompts_repeat;
    }
    std::ofstream f(*path);
    if (!f || !(f << j.dump(2) << "\n"))
      return fail(kCmd, invalid_argument(*path + ": cannot write the report"));
    std::fprintf(stderr, "bench serve: wrote %s\n", path->c_str());
  }
  for (const RunReport& r : runs)
    if (r.metrics.completed == 0) return 1;
  return 0;
}

int bench_cost(int argc, char** argv) {
  const char* kCmd = "bench cost";
  // --report may repeat: collect every occurrence before the common parser (which keeps one value).
  std::vector<std::string> reports;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--report" && i + 1 < argc)
      reports.push_back(argv[++i]);
    else if (s.rfind("--report=", 0) == 0)
      reports.push_back(s.substr(9));
    else
      rest.push_back(argv[i]);
  }
  Args a(kCmd,
         "$ per million tokens of `bench serve` reports, from a price table.\n"
         "  pagellm bench cost --report run.json [--report other.json ...] --gpu H200 --gpus 1",
         {{"Pricing",
           {{"report", "FILE.json", "a `bench serve --output-json` report; repeat for several",
             std::nullopt, "the positional arguments"},
            {"gpu", "NAME", "price the reports on this GPU (a key of the price table)",
             std::nullopt, "each report's own gpu tag"},
            {"gpus", "N", "GPUs the server ran on", "1"},
            {"utilization", "F", "the share of paid hours the server is busy", "0.6"},
            {"prices", "FILE.toml", "the price table", "bench/prices.toml"},
            {"precision", "NAME", "the weights' precision to price", std::nullopt,
             "each report's own precision tag"},
            {"json", "", "print the rows as JSON"}}}});
  if (auto rc = parse_command_line(a, static_cast<int>(rest.size()), rest.data())) return *rc;
  for (const auto& p : a.positionals()) reports.push_back(p);
  // --report on the command line was taken above; the environment or a --config file may set one.
  if (auto r = a.get("report")) reports.push_back(*r);
  if (reports.empty()) return fail(kCmd, invalid_argument("give at least one --report FILE.json"));
  auto gpus = a.get_int("gpus");
  auto util = a.get_double("utilization");
  if (!gpus.ok()) return fail(kCmd, gpus.status());
  if (!util.ok()) return fail(kCmd, util.status());
  auto prices = PriceTable::load(a.str("prices"));
  if (!prices.ok()) return fail(kCmd, prices.status());
  std::vector<CostRow> rows;
  for (const std::string& path : reports) {
    std::ifstream f(path);
    if (!f) return fail(kCmd, not_found(path + ": cannot open the report"));
    std::stringstream ss;
    ss << f.rdbuf();
    const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return fail(kCmd, data_loss(path + ": not a JSON report"));
    if (j.value("schema", "") != kReportSchema)
      return fail(kCmd, data_loss(path + ": schema is not " + std::string(kReportSchema)));
    if (!j.contains("output_throughput") || !j["output_throughput"].is_number())
      return fail(kCmd, data_loss(path + ": no numeric 'output_throughput'"));
    CostInput in;
    in.label = path;
    // The command line wins over the report's tags, so one report can be priced on other GPUs.
    in.gpu = a.has("gpu") ? *a.get("gpu") : j.value("gpu", "");
    in.precision = a.has("precision") ? *a.get("precision") : j.value("precision", "");
    if (in.gpu.empty())
      return fail(kCmd, invalid_argument(path + ": no 'gpu' in the report: pass --gpu"));
    in.n_gpus = *gpus;
    in.utilization = *util;
    in.output_tokens_per_s = j["output_throughput"].get<double>();
    in.total_tokens_per_s = j.value("total_token_throughput", 0.0);
    auto row = compute_cost(in, *prices);
    if (!row.ok())
      return fail(kCmd, Status(row.status().code(), path + ": " + row.status().message()));
    rows.push_back(*row);
  }
  std::printf("%s", cost_markdown(rows).c_str());
  if (a.flag("json")) {
    nlohmann::json arr = nlohmann::json::array();
    for (const CostRow& r : rows)
      arr.push_back({{"report", r.in.label},
                     {"gpu", r.in.gpu},
                     {"precision", r.in.precision},
                     {"units", r.in.n_gpus},
                     {"utilization", r.in.utilization},
                     {"output_throughput", r.in.output_tokens_per_s},
                     {"usd_per_hour", r.usd_per_hour},
                     {"output_tok_s_per_usd_hour", r.output_tok_s_per_usd_hour},
                     {"usd_per_million_output_tokens", r.usd_per_million_output},
                     {"usd_per_million_total_tokens", r.usd_per_million_total}});
    std::printf("%s\n", arr.dump().c_str());
  }
  return 0;
}

}  // namespace pagellm::cli
