#include "bench/client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "bench/sse.h"

namespace pagellm::bench {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string one_line(std::string s, size_t max = 200) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

class Runner;

// One request on its own connection (or a reused keep-alive one).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Runner& r, size_t idx, std::unique_ptr<beast::tcp_stream> reused);
  void start();

 private:
  void connect();
  void write();
  void on_write(error_code ec);
  void on_header(error_code ec);
  void read_more();
  void on_read(error_code ec);
  void handle_bytes(std::string_view bytes, Clock::time_point now);
  void handle_event(const std::string& data, Clock::time_point now);
  void on_body_end();
  void on_io_error(error_code ec, const char* phase);
  // Arms the stream's timer: the stall timeout, never past the request's deadline.
  void arm();
  void fail(std::string kind, std::string detail);
  void succeed();
  void finish(bool reusable);

  Runner& r_;
  size_t idx_;
  std::unique_ptr<beast::tcp_stream> stream_;
  bool reused_ = false;
  http::request<http::string_body> req_;
  beast::flat_buffer buf_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char chunk_[16384];
  SseParser sse_;
  std::vector<std::string> events_;
  RequestResult res_;
  Clock::time_point t0_, deadline_, last_chunk_, done_at_;
  int64_t n_content_chunks_ = 0;
  int64_t n_events_ = 0;
  size_t n_body_bytes_ = 0;
  bool got_usage_ = false;
  bool got_finish_reason_ = false;
  bool done_seen_ = false;
  bool finished_ = false;
  unsigned error_status_ = 0;  // non-200 status whose body is being read for the message
  std::string error_body_;
};

class Runner {
 public:
  Runner(const ClientOptions& o, const std::vector<BenchRequest>& reqs, const std::vector<double>& times,
         tcp::resolver::results_type endpoints, std::string host_header, std::string target)
      : o_(o), reqs_(reqs), times_(times), endpoints_(std::move(endpoints)),
        host_header_(std::move(host_header)), arrival_timer_(ioc_), target_(std::move(target)) {
    results_.resize(reqs.size());
  }

  double run() {
    t_start_ = Clock::now();
    t_end_ = t_start_;
    schedule_arrivals();
    ioc_.run();
    return secs(t_end_ - t_start_);
  }

  std::vector<RequestResult>& results() { return results_; }

 private:
  friend class Session;

  void schedule_arrivals() {
    const auto now = Clock::now();
    while (next_ < reqs_.size() && t_start_ + to_duration(times_[next_]) <= now) arrive(next_++);
    if (next_ >= reqs_.size()) return;
    arrival_timer_.expires_at(t_start_ + to_duration(times_[next_]));
    arrival_timer_.async_wait([this](error_code ec) {
      if (!ec) schedule_arrivals();
    });
  }

  void arrive(size_t i) {
    if (o_.max_concurrency > 0 && active_ >= o_.max_concurrency) {
      waiting_.push_back(i);
      return;
    }
    launch(i);
  }

  void launch(size_t i) {
    ++active_;
    std::unique_ptr<beast::tcp_stream> s;
    if (!idle_.empty()) {
      s = std::move(idle_.back());
      idle_.pop_back();
    }
    std::make_shared<Session>(*this, i, std::move(s))->start();
  }

  void done(size_t i, RequestResult r, std::unique_ptr<beast::tcp_stream> reusable) {
    results_[i] = std::move(r);
    --active_;
    ++n_done_;
    t_end_ = Clock::now();
    if (reusable && o_.keep_alive) idle_.push_back(std::move(reusable));
    if (!waiting_.empty() && (o_.max_concurrency <= 0 || active_ < o_.max_concurrency)) {
      const size_t j = waiting_.front();
      waiting_.pop_front();
      launch(j);
    }
    if (n_done_ == reqs_.size()) {
      // Closing idle keep-alive connections leaves the io_context without work: run() returns.
      for (auto& s : idle_) {
        error_code ec;
        s->socket().shutdown(tcp::socket::shutdown_both, ec);
        s->close();
      }
      idle_.clear();
    }
  }

  net::io_context ioc_;
  const ClientOptions& o_;
  const std::vector<BenchRequest>& reqs_;
  const std::vector<double>& times_;
  tcp::resolver::results_type endpoints_;
  std::string host_header_;
  net::steady_timer arrival_timer_;
  std::vector<RequestResult> results_;
  std::deque<size_t> waiting_;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle_;
  size_t next_ = 0;
  size_t n_done_ = 0;
  int64_t active_ = 0;
  Clock::time_point t_start_, t_end_;
  std::string target_;
};

Session::Session(Runner& r, size_t idx, std::unique_ptr<beast::tcp_stream> reused)
    : r_(r), idx_(idx), stream_(std::move(reused)), reused_(stream_ != nullptr) {}

void Session::start() {
  t0_ = Clock::now();
  deadline_ = t0_ + to_duration(r_.o_.timeout_s);
  res_.start_s = secs(t0_ - r_.t_start_);
  res_.prompt_tokens = r_.reqs_[idx_].prompt_len;
  req_ = {http::verb::post, r_.target_, 11};
  req_.set(http::field::host, r_.host_header_);
  req_.set(http::field::user_agent, "pagellm-bench");
  req_.set(http::field::content_type, "application/json");
  req_.set(http::field::accept, "text/event-stream");
  if (!r_.o_.api_key.empty()) req_.set(http::field::authorization, "Bearer " + r_.o_.api_key);
  req_.keep_alive(r_.o_.keep_alive);
  req_.body() = completion_body(r_.o_, r_.reqs_[idx_]);
  req_.prepare_payload();
  if (stream_) write();
  else connect();
}

void Session::arm() {
  stream_->expires_at(std::min(Clock::now() + to_duration(r_.o_.stall_timeout_s), deadline_));
}

void Session::connect() {
  reused_ = false;
  stream_ = std::make_unique<beast::tcp_stream>(r_.ioc_);
  arm();
  stream_->async_connect(r_.endpoints_, [self = shared_from_this()](error_code ec, const tcp::endpoint&) {
    if (ec) return self->on_io_error(ec, "connect");
    self->write();
  });
}

void Session::write() {
  arm();
  http::async_write(*stream_, req_, [self = shared_from_this()](error_code ec, size_t) { self->on_write(ec); });
}

void Session::on_write(error_code ec) {
  if (ec) return on_io_error(ec, "write");
  parser_.emplace();
  // A stream is bounded by max_tokens and the deadline, not by a byte count.
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  arm();
  http::async_read_header(*stream_, buf_, *parser_,
                          [self = shared_from_this()](error_code ec2, size_t) { self->on_header(ec2); });
}

void Session::on_header(error_code ec) {
  if (ec) return on_io_error(ec, "read");
  reused_ = false;  // the server answered: from here on, errors are the server's
  const unsigned status = parser_->get().result_int();
  if (status != 200) error_status_ = status;
  if (parser_->is_done()) return on_body_end();
  read_more();
}

void Session::read_more() {
  auto& body = parser_->get().body();
  body.data = chunk_;
  body.size = sizeof chunk_;
  arm();
  http::async_read_some(*stream_, buf_, *parser_,
                        [self = shared_from_this()](error_code ec, size_t) { self->on_read(ec); });
}

void Session::on_read(error_code ec) {
  const auto now = Clock::now();
  if (ec == http::error::need_buffer) ec = {};
  const size_t got = sizeof chunk_ - parser_->get().body().size;
  if (got > 0) handle_bytes(std::string_view(chunk_, got), now);
  if (finished_) return;
  if (ec) return on_io_error(ec, "read");
  if (parser_->is_done()) return on_body_end();
  read_more();
}

void Session::handle_bytes(std::string_view bytes, Clock::time_point now) {
  n_body_bytes_ += bytes.size();
  if (error_status_) {
    if (error_body_.size() < 1024) error_body_.append(bytes.substr(0, 1024 - error_body_.size()));
    return;
  }
  if (done_seen_) return;  // draining a keep-alive response after [DONE]
  events_.clear();
  sse_.feed(bytes, events_);
  if (sse_.overflowed()) return fail("malformed_sse", "an SSE event longer than 16 MiB");
  for (const std::string& e : events_) {
    ++n_events_;
    handle_event(e, now);
    if (finished_ || done_seen_) return;
  }
}

void Session::handle_event(const std::string& data, Clock::time_point now) {
  if (data == "[DONE]") {
    done_seen_ = true;
    done_at_ = now;
    if (!r_.o_.keep_alive) succeed();
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail("malformed_sse", "not JSON: " + one_line(data));
  if (const auto e = j.find("error"); e != j.end()) {
    std::string msg = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                          ? (*e)["message"].get<std::string>() : e->dump();
    return fail("stream_error", one_line(msg));
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    const auto ct = u->find("completion_tokens"), pt = u->find("prompt_tokens");
    if (ct != u->end() && ct->is_number_integer()) {
      res_.output_tokens = ct->get<int64_t>();
      got_usage_ = true;
    }
    if (pt != u->end() && pt->is_number_integer()) res_.prompt_tokens = pt->get<int64_t>();
  }
  const auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return;
  const auto& c = (*choices)[0];
  if (!c.is_object()) return fail("malformed_sse", "choices[0] is not an object");
  bool content = false;
  if (const auto t = c.find("text"); t != c.end() && t->is_string() && !t->get_ref<const std::string&>().empty())
    content = true;
  if (const auto d = c.find("delta"); d != c.end() && d->is_object()) {  // chat-style chunks
    const auto t = d->find("content");
    if (t != d->end() && t->is_string() && !t->get_ref<const std::string&>().empty()) content = true;
  }
  // Token ids count as content too (vLLM's / pagellm's return_token_ids): a model served without
  // a tokenizer streams ids with empty text.
  if (const auto ids = c.find("token_ids"); ids != c.end() && ids->is_array() && !ids->empty())
    content = true;
  if (const auto f = c.find("finish_reason"); f != c.end() && f->is_string()) got_finish_reason_ = true;
  if (!content) return;
  if (n_content_chunks_ == 0) res_.ttft_s = secs(now - t0_);
  else res_.itl_s.push_back(secs(now - last_chunk_));
  last_chunk_ = now;
  ++n_content_chunks_;
}

void Session::on_body_end() {
  if (error_status_) {
    return fail("http_" + std::to_string(error_status_),
                "HTTP " + std::to_string(error_status_) + ": " + one_line(error_body_));
  }
  if (done_seen_) return succeed();
  // Some servers end the stream without "data: [DONE]": a clean end after the final chunk counts.
  if (got_finish_reason_ && n_content_chunks_ > 0) {
    done_at_ = Clock::now();
    return succeed();
  }
  if (n_events_ == 0) {
    // A whole body without one SSE event: the server ignored "stream": true (or is not OpenAI's).
    return fail("malformed_sse", "the response held no SSE event (Content-Type: " +
                                     std::string(parser_->get()[http::field::content_type]) + ")");
  }
  fail("dropped", "the stream ended before [DONE]");
}

void Session::on_io_error(error_code ec, const char* phase) {
  if (finished_) return;
  const bool before_response = !parser_ || !parser_->is_header_done();
  if (reused_ && before_response && ec != beast::error::timeout) {
    // The server closed an idle keep-alive connection: retry once on a fresh one.
    error_code ignored;
    stream_->socket().close(ignored);
    return connect();
  }
  if (done_seen_) return succeed();  // the body ended untidily after [DONE]: the answer is whole
  if (ec == beast::error::timeout) {
    if (Clock::now() >= deadline_) return fail("timeout", std::string("no response within the deadline (") + phase + ")");
    if (std::string_view(phase) == "connect") return fail("connect", "connect timed out");
    char b[96];
    std::snprintf(b, sizeof b, "no byte for %g s (%s)", r_.o_.stall_timeout_s, phase);
    return fail("stalled", b);
  }
  if (std::string_view(phase) == "connect") return fail("connect", ec.message());
  if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
      ec != http::error::end_of_stream &&
      ec != http::error::partial_message) {
    return fail("malformed_http", ec.message());
  }
  fail("dropped", std::string(phase) + ": " + ec.message());
}

void Session::fail(std::string kind, std::string detail) {
  if (finished_) return;
  res_.ok = false;
  res_.error_kind = std::move(kind);
  res_.error_detail = std::move(detail);
  finish(false);
}

void Session::succeed() {
  if (finished_) return;
  res_.ok = true;
  res_.latency_s = secs(done_at_ - t0_);
  if (!got_usage_) res_.output_tokens = n_content_chunks_;  // the server sent no usage: count chunks
  if (n_content_chunks_ == 0) return fail("empty", "the stream had no content");
  // Keep-alive reuses a connection only once its response is read to the end (handle_event
  // keeps reading after [DONE] for that).
  const bool reusable = r_.o_.keep_alive && parser_ && parser_->is_done() && parser_->get().keep_alive();
  finish(reusable);
}

void Session::finish(bool reusable) {
  finished_ = true;
  std::unique_ptr<beast::tcp_stream> keep;
  if (stream_) {
    if (reusable) {
      stream_->expires_never();
      keep = std::move(stream_);
    } else {
      error_code ec;
      stream_->socket().shutdown(tcp::socket::shutdown_both, ec);
      stream_->close();
    }
  }
  r_.done(idx_, std::move(res_), std::move(keep));
}

}  // namespace

Result<Endpoint> parse_base_url(std::string_view url) {
  const std::string u(url);
  if (u.rfind("https://", 0) == 0) return invalid_argument("--base-url " + u + ": https is not supported; use http://");
  if (u.rfind("http://", 0) != 0) return invalid_argument("--base-url " + u + ": must start with http://");
  std::string rest = u.substr(7);
  Endpoint e;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    e.prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!e.prefix.empty() && e.prefix.back() == '/') e.prefix.pop_back();
  }
  if (!rest.empty() && rest[0] == '[') {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return invalid_argument("--base-url " + u + ": unterminated IPv6 address");
    e.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest[0] == ':') e.port = rest.substr(1);
  } else {
    const size_t colon = rest.find(':');
    e.host = rest.substr(0, colon);
    if (colon != std::string::npos) e.port = rest.substr(colon + 1);
  }
  if (e.host.empty()) return invalid_argument("--base-url " + u + ": no host");
  if (e.port.empty() || e.port.size() > 5 || !std::all_of(e.port.begin(), e.port.end(), ::isdigit) ||
      std::stoi(e.port) < 1 || std::stoi(e.port) > 65535)
    return invalid_argument("--base-url " + u + ": bad port '" + e.port + "'");
  return e;
}

std::string completion_body(const ClientOptions& o, const BenchRequest& r) {
  nlohmann::json j = {{"model", o.model},
                      {"max_tokens", r.max_tokens},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}};
  if (!r.prompt_ids.empty()) j["prompt"] = r.prompt_ids;
  else j["prompt"] = r.prompt_text;
  if (o.ignore_eos) j["ignore_eos"] = true;
  if (o.extra_body.is_object())
    for (const auto& [k, v] : o.extra_body.items()) j[k] = v;
  return j.dump();
}

namespace {

Result<tcp::resolver::results_type> resolve(net::io_context& ioc, const Endpoint& e) {
  tcp::resolver resolver(ioc);
  error_code ec;
  auto res = resolver.resolve(e.host, e.port, ec);
  if (ec) return invalid_argument("cannot resolve " + e.host + ":" + e.port + ": " + ec.message());
  return res;
}

}  // namespace

Result<LoadResult> run_load(const ClientOptions& o, const std::vector<BenchRequest>& reqs,
                            const std::vector<double>& send_times_s) {
  if (reqs.size() != send_times_s.size()) return invalid_argument("run_load: one send time per request");
  if (!(o.timeout_s > 0) || !(o.stall_timeout_s > 0))
    return invalid_argument("--timeout and --stall-timeout must be > 0");
  auto ep = parse_base_url(o.base_url);
  if (!ep.ok()) return ep.status();
  net::io_context resolver_ctx;
  auto endpoints = resolve(resolver_ctx, *ep);
  if (!endpoints.ok()) return endpoints.status();
  Runner runner(o, reqs, send_times_s, *endpoints, ep->host + ":" + ep->port, ep->prefix + o.path);
  LoadResult out;
  out.duration_s = reqs.empty() ? 0 : runner.run();
  out.results = std::move(runner.results());
  return out;
}

Result<std::string> http_get(const std::string& base_url, const std::string& path, double timeout_s) {
  auto ep = parse_base_url(base_url);
  if (!ep.ok()) return ep.status();
  net::io_context ioc;
  auto endpoints = resolve(ioc, *ep);
  if (!endpoints.ok()) return endpoints.status();
  const std::string url = base_url + path;
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buf;
  http::request<http::string_body> req{http::verb::get, ep->prefix + path, 11};
  req.set(http::field::host, ep->host + ":" + ep->port);
  req.set(http::field::user_agent, "pagellm-bench");
  req.keep_alive(false);
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  error_code result;
  // Timeouts of beast::tcp_stream apply to asynchronous operations only, hence the callbacks.
  stream.expires_after(to_duration(timeout_s));
  stream.async_connect(*endpoints, [&](error_code ec, const tcp::endpoint&) {
    if (ec) { result = ec; return; }
    http::async_write(stream, req, [&](error_code ec2, size_t) {
      if (ec2) { result = ec2; return; }
      http::async_read(stream, buf, parser, [&](error_code ec3, size_t) { result = ec3; });
    });
  });
  ioc.run();
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (result) return internal_error("GET " + url + ": " + result.message());
  const unsigned status = parser.get().result_int();
  if (status / 100 != 2) return internal_error("GET " + url + ": HTTP " + std::to_string(status));
  return parser.get().body();
}

}  // namespace pagellm::bench
