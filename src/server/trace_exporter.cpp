#include "server/trace_exporter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <nlohmann/json.hpp>

#include "server/server_log.h"

namespace pagellm::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

// Failures are logged at most this often (the rest are counted into the next line).
constexpr auto kLogInterval = std::chrono::seconds(30);
// A Retry-After longer than this is cut to it: the queue fills meanwhile.
constexpr double kMaxRetryAfterS = 60;
// The collector's answer is small (an ExportTraceServiceResponse or a Status).
constexpr uint64_t kMaxResponseBytes = 1 << 20;

std::string n_spans(int64_t n) {
  return std::to_string(n) + (n == 1 ? " span" : " spans");
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// A blocking HTTP/1.1 client for one endpoint, run on the exporter thread: asynchronous Beast
// operations on a private io_context, driven in short slices so that a deadline that moves (the
// shutdown limit) is noticed within 50 ms. Keeps its connection alive between posts.
class OtlpHttpClient {
 public:
  struct Response {
    int status = 0;  // 0: no response; `error` says why
    std::string error;
    double retry_after_s = -1;  // the Retry-After header in seconds, when present and numeric
    std::string content_type;
    std::string body;
  };
  using DeadlineFn = std::function<Clock::time_point()>;

  OtlpHttpClient(OtlpEndpoint ep, std::string user_agent)
      : ep_(std::move(ep)), user_agent_(std::move(user_agent)) {}
  ~OtlpHttpClient() {
    try {
      close();
    } catch (...) {  // a handler run by close() threw: nothing left to do about it
    }
  }

  Response post(const std::string& body, const DeadlineFn& deadline) {
    Response r;
    // A kept-alive connection the collector has closed meanwhile fails the first write or read:
    // one more try on a fresh connection.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool reused = connected_;
      if (!connected_ && !connect(deadline, r.error)) return r;
      auto st = std::make_shared<PostState>();
      st->req = {http::verb::post, ep_.target, 11};
      st->req.set(http::field::host, ep_.host_header);
      st->req.set(http::field::content_type, "application/json");
      st->req.set(http::field::user_agent, user_agent_);
      st->req.keep_alive(true);
      st->req.body() = body;
      st->req.prepare_payload();
      st->parser.body_limit(kMaxResponseBytes);
      http::async_write(socket_, st->req, [st](error_code ec, size_t) { st->finish(ec); });
      if (!wait(*st, deadline)) {
        r.error = "timed out sending to " + where();
        return r;
      }
      if (st->ec) {
        close();
        if (reused) continue;
        r.error = "sending to " + where() + ": " + st->ec.message();
        return r;
      }
      st->done = false;
      http::async_read(socket_, buffer_, st->parser,
                       [st](error_code ec, size_t) { st->finish(ec); });
      if (!wait(*st, deadline)) {
        r.error = "timed out waiting for the response of " + where();
        return r;
      }
      if (st->ec) {
        close();
        if (reused && !st->parser.got_some()) continue;
        r.error = "reading the response of " + where() + ": " + st->ec.message();
        return r;
      }
      auto& res = st->parser.get();
      r.status = static_cast<int>(res.result_int());
      if (auto it = res.find(http::field::retry_after); it != res.end()) {
        const std::string v(it->value());
        if (!v.empty() &&
            std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
          r.retry_after_s = std::min(kMaxRetryAfterS, std::stod(v));
      }
      if (auto it = res.find(http::field::content_type); it != res.end())
        r.content_type = std::string(it->value());
      r.body = std::move(res.body());
      if (!res.keep_alive()) close();
      return r;
    }
    return r;
  }

  std::string where() const { return ep_.host + ":" + ep_.port; }

 private:
  struct OpState {
    bool done = false;
    error_code ec;
    void finish(error_code e) {
      ec = e;
      done = true;
    }
  };
  // Handlers own their state (shared_ptr), so one abandoned at a deadline that completes later
  // touches nothing of the caller's.
  struct PostState : OpState {
    http::request<http::string_body> req;
    http::response_parser<http::string_body> parser;
  };
  struct ResolveState : OpState {
    std::vector<tcp::endpoint> endpoints;
  };

  // Runs the io_context until `op` is done; false (and the connection closed) at the deadline.
  bool wait(const OpState& op, const DeadlineFn& deadline) {
    while (!op.done) {
      const auto now = Clock::now();
      const auto dl = deadline();
      if (now >= dl) {
        resolver_.cancel();
        close();
        return false;
      }
      ioc_.restart();
      ioc_.run_one_for(std::min<Clock::duration>(std::chrono::milliseconds(50), dl - now));
    }
    return true;
  }

  bool connect(const DeadlineFn& deadline, std::string& error) {
    close();
    std::vector<tcp::endpoint> endpoints;
    error_code ec;
    const auto addr = net::ip::make_address(ep_.host, ec);
    const auto port = static_cast<uint16_t>(std::stoi(ep_.port));
    if (!ec) {
      endpoints.emplace_back(addr, port);
    } else {
      auto rs = std::make_shared<ResolveState>();
      resolver_.async_resolve(ep_.host, ep_.port,
                              [rs](error_code e, const tcp::resolver::results_type& results) {
                                for (const auto& r : results) rs->endpoints.push_back(r.endpoint());
                                rs->finish(e);
                              });
      if (!wait(*rs, deadline)) {
        error = "timed out resolving " + ep_.host;
        return false;
      }
      if (rs->ec || rs->endpoints.empty()) {
        error = "resolving " + ep_.host + ": " + (rs->ec ? rs->ec.message() : "no address");
        return false;
      }
      endpoints = std::move(rs->endpoints);
    }
    auto cs = std::make_shared<OpState>();
    net::async_connect(socket_, endpoints,
                       [cs](error_code e, const tcp::endpoint&) { cs->finish(e); });
    if (!wait(*cs, deadline)) {
      error = "timed out connecting to " + where();
      return false;
    }
    if (cs->ec) {
      close();
      error = "connecting to " + where() + ": " + cs->ec.message();
      return false;
    }
    socket_.set_option(tcp::no_delay(true), ec);
    connected_ = true;
    return true;
  }

  void close() {
    error_code ignored;
    if (socket_.is_open()) {
      socket_.shutdown(tcp::socket::shutdown_both, ignored);
      socket_.close(ignored);
    }
    // The cancelled operations' handlers run now, before their buffer is reused.
    ioc_.restart();
    ioc_.poll();
    buffer_.clear();
    connected_ = false;
  }

  OtlpEndpoint ep_;
  std::string user_agent_;
  net::io_context ioc_;
  tcp::socket socket_{ioc_};
  tcp::resolver resolver_{ioc_};
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

Result<OtlpEndpoint> parse_otlp_endpoint(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return invalid_argument(
        "--otlp-traces-endpoint '" + url + "': " + why +
        " (expected http://HOST[:PORT]/PATH, e.g. http://localhost:4318/v1/traces)");
  };
  std::string rest;
  if (url.rfind("https://", 0) == 0)
    return bad(
        "https is not supported; send to an http:// collector (e.g. a local OpenTelemetry "
        "Collector, which can forward over TLS)");
  if (url.rfind("http://", 0) != 0) return bad("the scheme must be http://");
  rest = url.substr(7);
  OtlpEndpoint ep;
  const size_t slash = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, slash);
  ep.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (const size_t hash = ep.target.find('#'); hash != std::string::npos) ep.target.resize(hash);
  if (ep.target.empty() || ep.target[0] != '/') ep.target = "/" + ep.target;
  if (authority.find('@') != std::string::npos) return bad("user information is not supported");
  if (authority.empty()) return bad("no host");
  std::string port;
  if (authority[0] == '[') {  // IPv6 literal
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("unterminated IPv6 address");
    ep.host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("junk after the IPv6 address");
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    ep.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (ep.host.empty()) return bad("no host");
  for (char c : ep.host)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '[' || c == ']')
      return bad("invalid host");
  if (port.empty()) port = "80";
  if (port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    return bad("invalid port");
  ep.port = port;
  ep.host_header = authority;
  return ep;
}

Result<std::unique_ptr<TraceExporter>> TraceExporter::create(const TracingConfig& config,
                                                             const std::string& version) {
  auto ep = parse_otlp_endpoint(config.endpoint);
  if (!ep.ok()) return ep.status();
  if (config.max_queue_size < 1 || config.max_export_batch_size < 1 || config.max_retries < 0 ||
      !(config.schedule_delay_s >= 0) || !(config.export_timeout_s > 0) ||
      !(config.initial_backoff_s >= 0) || !(config.max_backoff_s >= 0) ||
      !(config.shutdown_timeout_s >= 0))
    return invalid_argument("tracing: queue and batch sizes must be positive, times non-negative");
  if (config.service_name.empty()) return invalid_argument("tracing: the service name is empty");
  std::unique_ptr<TraceExporter> e(
      new TraceExporter(config, std::move(*ep), make_trace_resource(config.service_name, version)));
  e->client_ = std::make_unique<OtlpHttpClient>(e->endpoint_, "pagellm/" + version);
  e->thread_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

TraceExporter::TraceExporter(TracingConfig config, OtlpEndpoint endpoint, TraceResource resource)
    : config_(std::move(config)), endpoint_(std::move(endpoint)), resource_(std::move(resource)) {}

TraceExporter::~TraceExporter() {
  shutdown(config_.shutdown_timeout_s);
}

void TraceExporter::submit(Span&& span) {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_ || queue_.size() >= static_cast<size_t>(config_.max_queue_size)) {
      dropped_queue_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(span));
    n = queue_.size();
  }
  // The thread sleeps on an empty queue and then until the batch is full or its delay passes:
  // only those two moments need waking it.
  if (n == 1 || n == static_cast<size_t>(config_.max_export_batch_size)) cv_.notify_one();
}

void TraceExporter::shutdown(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = Clock::now() + seconds(std::max(0.0, timeout_s));
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  dropped_queue_.fetch_add(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
  queue_.clear();
}

TraceExportStats TraceExporter::stats() const {
  TraceExportStats s;
  s.exported = exported_.load(std::memory_order_relaxed);
  s.dropped_queue = dropped_queue_.load(std::memory_order_relaxed);
  s.dropped_export = dropped_export_.load(std::memory_order_relaxed);
  return s;
}

void TraceExporter::run() {
  std::vector<Span> batch;
  const size_t batch_size = static_cast<size_t>(config_.max_export_batch_size);
  int64_t dropped_logged = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, all sent
      if (!stopping_) {
        // The first span of a batch waits at most schedule_delay_s for the others.
        const auto flush_at = Clock::now() + seconds(config_.schedule_delay_s);
        cv_.wait_until(lock, flush_at, [&] { return stopping_ || queue_.size() >= batch_size; });
      }
      if (stopping_ && Clock::now() >= stop_deadline_) break;
      const size_t n = std::min(batch_size, queue_.size());
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    export_batch(batch);
    batch.clear();
    if (const int64_t d = dropped_queue_.load(std::memory_order_relaxed); d > dropped_logged) {
      log_failure(n_spans(d - dropped_logged) + " dropped: the queue (" +
                  std::to_string(config_.max_queue_size) + " spans) was full");
      dropped_logged = d;
    }
  }
}

Clock::time_point TraceExporter::deadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_ ? stop_deadline_ : Clock::time_point::max();
}

bool TraceExporter::export_batch(std::vector<Span>& batch) {
  const std::string body = encode_otlp_json(resource_, batch);
  const auto n = static_cast<int64_t>(batch.size());
  std::mt19937 jitter_rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  for (int32_t attempt = 0;; ++attempt) {
    const auto post_end = Clock::now() + seconds(config_.export_timeout_s);
    auto r = client_->post(body, [&] { return std::min(post_end, deadline()); });
    if (r.status >= 200 && r.status < 300) {
      exported_.fetch_add(n, std::memory_order_relaxed);
      // A partial success names spans the collector rejected; not retried (the specification).
      if (r.content_type.find("json") != std::string::npos && !r.body.empty()) {
        auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("partialSuccess") && j["partialSuccess"].is_object() &&
            !j["partialSuccess"].empty())
          log_failure("the collector rejected part of a batch: " + j["partialSuccess"].dump());
      }
      return true;
    }
    const bool retryable =
        r.status == 0 || r.status == 429 || r.status == 502 || r.status == 503 || r.status == 504;
    const std::string what =
        r.status == 0 ? r.error
                      : "HTTP " + std::to_string(r.status) + " from " + client_->where() +
                            endpoint_.target + (r.body.empty() ? "" : ": " + r.body.substr(0, 200));
    if (!retryable || attempt >= config_.max_retries) {
      dropped_export_.fetch_add(n, std::memory_order_relaxed);
      log_failure(what + " (" + n_spans(n) + " dropped after " + std::to_string(attempt + 1) +
                  (attempt == 0 ? " try)" : " tries)"));
      return false;
    }
    double wait_s = r.retry_after_s;
    if (wait_s < 0)
      wait_s = std::min(config_.max_backoff_s, config_.initial_backoff_s * std::pow(2.0, attempt)) *
               jitter(jitter_rng);
    char in[32];
    std::snprintf(in, sizeof in, "%.1f", wait_s);
    log_failure(what + " (retrying in " + in + " s)");
    if (!backoff_wait(seconds(wait_s))) {
      dropped_export_.fetch_add(n, std::memory_order_relaxed);
      log_failure(what + " (" + n_spans(n) + " dropped: shutdown limit reached)");
      return false;
    }
  }
}

bool TraceExporter::backoff_wait(Clock::duration d) {
  const auto end = Clock::now() + d;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (stopping_ && stop_deadline_ < end) return false;  // the retry would come too late
    if (Clock::now() >= end) return true;
    cv_.wait_until(lock, end);
  }
}

void TraceExporter::log_failure(const std::string& what) {
  const auto now = Clock::now();
  if (last_log_ != Clock::time_point{} && now - last_log_ < kLogInterval) {
    ++n_unlogged_failures_;
    return;
  }
  nlohmann::ordered_json f;
  f["endpoint"] = config_.endpoint;
  if (n_unlogged_failures_ > 0) f["failures_not_logged"] = n_unlogged_failures_;
  log_request(LogLevel::kWarn, "", "trace export: " + what, f);
  last_log_ = now;
  n_unlogged_failures_ = 0;
}

}  // namespace pagellm::server
