#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <random>
#include <unordered_map>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "core/log.h"
#include "server/api_error.h"
#include "server/server_log.h"

namespace pagellm::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

// A client-supplied X-Request-Id is kept only if it cannot break a header or a log line.
bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == ':' || c == '/' || c == '+' || c == '=';
  });
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// The chunk framing of Transfer-Encoding: chunked.
std::string chunk(std::string_view data) {
  char head[24];
  const int n = std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  std::string out;
  out.reserve(n + data.size() + 2);
  out.append(head, n);
  out.append(data);
  out += "\r\n";
  return out;
}

// Origins allowed by --cors-origin ("*" or a comma-separated list); "" if `origin` is not one.
std::string cors_allow(const std::string& config, std::string_view origin) {
  if (config.empty()) return "";
  if (config == "*") return "*";
  size_t pos = 0;
  while (pos <= config.size()) {
    size_t comma = config.find(',', pos);
    if (comma == std::string::npos) comma = config.size();
    std::string_view item(config.data() + pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty() && item == origin) return std::string(origin);
    pos = comma + 1;
  }
  return "";
}

}  // namespace

std::string random_hex_id() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (static_cast<uint64_t>(std::random_device{}()) << 32)};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string_view status_reason(int status) {
  const auto r = http::obsolete_reason(static_cast<http::status>(status));
  return {r.data(), r.size()};
}

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

// One TCP connection. All its handlers run on its strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer& server, tcp::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        request_timer_(socket_.get_executor()) {
    error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    if (!ec) peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    socket_.set_option(tcp::no_delay(true), ec);  // SSE pieces are small and latency-bound
    ++server_.n_connections_;
  }
  ~Session() {
    --server_.n_connections_;
    server_.unregister_session(this);
  }

  net::any_io_executor executor() { return socket_.get_executor(); }

  void start() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  // From any thread.
  void drain() {
    net::post(socket_.get_executor(), [self = shared_from_this()] {
      self->keep_alive_ = false;
      if (self->state_ == State::kReadingHeader) self->shutdown();
    });
  }
  void close() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->shutdown(); });
  }

  // --- called by Exchange, on the strand ---
  void write_response(Exchange& ex, int status, std::string_view content_type, std::string body,
                      const Headers& extra) {
    std::string out = head(ex, status, content_type, static_cast<int64_t>(body.size()), extra);
    if (ex.request().method != "HEAD") out += body;
    ex.bytes_sent_ += static_cast<int64_t>(body.size());
    response_complete_pending_ = true;
    enqueue(std::move(out));
  }
  void write_stream_head(Exchange& ex, int status, std::string_view content_type,
                         const Headers& extra) {
    if (!http11_) keep_alive_ = false;  // HTTP/1.0: no chunked encoding; the close ends the body
    enqueue(head(ex, status, content_type, -1, extra));
  }
  void write_stream_data(Exchange& ex, std::string data) {
    if (data.empty()) return;  // an empty chunk would end the body
    ex.bytes_sent_ += static_cast<int64_t>(data.size());
    enqueue(http11_ ? chunk(data) : std::move(data));
  }
  void write_stream_end() {
    response_complete_pending_ = true;
    enqueue(http11_ ? std::string("0\r\n\r\n") : std::string());
  }

 private:
  enum class State { kReadingHeader, kReadingBody, kBusy, kClosed };

  // --- reading a request ---
  void read_header() {
    if (state_ == State::kClosed) return;
    if (server_.draining() && !keep_alive_) return shutdown();
    state_ = State::kReadingHeader;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.config_.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(server_.config_.max_body_bytes));
    arm_read_timer(server_.config_.header_timeout_s);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    read_timer_.cancel();
    if (state_ == State::kClosed) return;
    if (ec) return on_read_error(ec, /*header=*/true);
    auto& req = parser_->get();
    http11_ = req.version() >= 11;
    // 100-continue: answer now (or refuse an oversized body before the client sends it).
    if (auto it = req.find(http::field::expect); it != req.end() && iequals(std::string_view(it->value().data(), it->value().size()), "100-continue")) {
      if (parser_->content_length() && *parser_->content_length() >
                                            static_cast<uint64_t>(server_.config_.max_body_bytes))
        return fail_read(413, "the request body exceeds --max-body-bytes " +
                                  std::to_string(server_.config_.max_body_bytes));
      continue_buf_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(continue_buf_),
                       [self = shared_from_this()](error_code ec, size_t) {
                         if (ec) return self->shutdown();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    if (state_ == State::kClosed) return;
    state_ = State::kReadingBody;
    if (parser_->is_done()) return on_body({});
    arm_read_timer(server_.config_.read_timeout_s);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    read_timer_.cancel();
    if (state_ == State::kClosed) return;
    if (ec) return on_read_error(ec, /*header=*/false);
    dispatch();
  }

  void on_read_error(error_code ec, bool header) {
    if (read_timed_out_) {
      read_timed_out_ = false;
      // A connection idle between requests just closes; a request that stalls gets a 408.
      if (header && buffer_.size() == 0) return shutdown();
      return fail_read(408, header ? "the request header was not received within --header-timeout"
                                   : "the request body was not received within --read-timeout");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::error::bad_descriptor)
      return shutdown();
    if (ec == http::error::body_limit)
      return fail_read(413, "the request body exceeds --max-body-bytes " +
                                std::to_string(server_.config_.max_body_bytes));
    if (ec == http::error::header_limit) return fail_read(431, "the request header is too large");
    return fail_read(400, "malformed HTTP request: " + ec.message());
  }

  // Answers a request that could not be read and closes the connection (its framing is lost).
  void fail_read(int status, std::string message) {
    keep_alive_ = false;
    HttpRequest r;
    if (parser_ && parser_->is_header_done()) {
      const auto& h = parser_->get();
      r.method.assign(h.method_string().data(), h.method_string().size());
      r.path.assign(h.target().data(), h.target().size());
    }
    r.request_id = random_hex_id();
    r.peer = peer_;
    r.arrival = std::chrono::steady_clock::now();
    state_ = State::kBusy;
    ++server_.n_active_;
    auto ex = std::make_shared<Exchange>(shared_from_this(), std::move(r));
    current_ = ex;
    start_monitor_ = false;
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    ex->respond(status, "application/json", error_body(e));
  }

  void arm_read_timer(double s) {
    const uint64_t gen = ++timer_gen_;
    read_timed_out_ = false;
    if (s <= 0) return;
    read_timer_.expires_after(seconds(s));
    read_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->timer_gen_ || self->state_ == State::kClosed ||
          self->state_ == State::kBusy)
        return;
      self->read_timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }

  // --- one request in flight ---
  void dispatch() {
    state_ = State::kBusy;
    auto& req = parser_->get();
    HttpRequest r;
    r.method.assign(req.method_string().data(), req.method_string().size());
    const std::string_view target(req.target().data(), req.target().size());
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& f : req)
      r.headers.emplace_back(std::string(f.name_string().data(), f.name_string().size()),
                             std::string(f.value().data(), f.value().size()));
    r.body = std::move(req.body());
    const std::string_view rid = r.header("x-request-id");
    r.request_id = valid_request_id(rid) ? std::string(rid) : random_hex_id();
    r.peer = peer_;
    r.arrival = std::chrono::steady_clock::now();
    if (!req.keep_alive()) keep_alive_ = false;
    if (server_.draining()) keep_alive_ = false;
    parser_.reset();

    ++server_.n_active_;
    auto ex = std::make_shared<Exchange>(shared_from_this(), std::move(r));
    current_ = ex;
    start_monitor_ = true;
    if (server_.config_.request_timeout_s > 0) {
      request_timer_.expires_after(seconds(server_.config_.request_timeout_s));
      request_timer_.async_wait([self = shared_from_this(), w = std::weak_ptr<Exchange>(ex)](error_code ec) {
        if (ec) return;
        if (auto e = w.lock(); e && self->current_ == e && !e->complete_) e->fire_timeout();
      });
    }

    const HttpRequest& rq = ex->request();
    // CORS preflight: answered here, never authenticated (browsers send no credentials on it).
    if (rq.method == "OPTIONS" && !server_.config_.cors_origin.empty() &&
        !rq.header("access-control-request-method").empty()) {
      std::string allow_headers(rq.header("access-control-request-headers"));
      if (allow_headers.empty()) allow_headers = "Authorization, Content-Type, X-Request-Id";
      ex->respond(204, "", "",
                  {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                   {"Access-Control-Allow-Headers", allow_headers},
                   {"Access-Control-Max-Age", "600"}});
    } else {
      try {
        server_.handler_(ex);
      } catch (const std::exception& e) {
        log_request(LogLevel::kError, ex->request_id(), std::string("handler failed: ") + e.what());
        if (!ex->started_) {
          ApiError err;
          err.status = 500;
          err.message = "internal server error";
          ex->respond(500, "application/json", error_body(err));
        }
      } catch (...) {
        if (!ex->started_) {
          ApiError err;
          err.status = 500;
          err.message = "internal server error";
          ex->respond(500, "application/json", error_body(err));
        }
      }
    }
    // Watch the socket for the client leaving while the handler works (unless it already
    // answered, or the request was unreadable and the connection closes anyway).
    if (start_monitor_ && current_ && !current_->complete_ && !monitoring_) monitor();
  }

  // A read while a request is in flight: EOF or an error means the client is gone. Bytes that
  // arrive (a pipelined next request) are kept for the next parse.
  void monitor() {
    if (state_ == State::kClosed) return;
    if (buffer_.size() >= kMaxPipelinedBytes) return;
    monitoring_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->monitoring_ = false;
      if (!ec) self->buffer_.commit(n);
      if (self->state_ == State::kClosed) return;
      if (self->monitor_stop_) {
        self->monitor_stop_ = false;
        if (ec && ec != net::error::operation_aborted) return self->shutdown();
        return self->read_header();
      }
      if (ec) return self->client_gone();
      self->monitor();
    });
  }

  void client_gone() {
    if (state_ == State::kClosed) return;
    shutdown();
  }

  // --- writing ---
  std::string head(Exchange& ex, int status, std::string_view content_type, int64_t content_length,
                   const Headers& extra) {
    std::string h;
    h.reserve(256);
    h += http11_ ? "HTTP/1.1 " : "HTTP/1.0 ";
    h += std::to_string(status);
    h += ' ';
    h += status_reason(status);
    h += "\r\nServer: pagellm\r\n";
    if (!content_type.empty()) {
      h += "Content-Type: ";
      h += content_type;
      h += "\r\n";
    }
    if (content_length >= 0) {
      h += "Content-Length: " + std::to_string(content_length) + "\r\n";
    } else if (http11_) {
      h += "Transfer-Encoding: chunked\r\n";
    }
    h += "X-Request-Id: " + ex.request_id() + "\r\n";
    if (server_.draining()) keep_alive_ = false;
    h += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    const std::string origin =
        cors_allow(server_.config_.cors_origin, ex.request().header("origin"));
    if (!origin.empty()) {
      h += "Access-Control-Allow-Origin: " + origin + "\r\n";
      h += "Access-Control-Expose-Headers: X-Request-Id\r\n";
      if (origin != "*") h += "Vary: Origin\r\n";
    }
    for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
    h += "\r\n";
    return h;
  }

  void enqueue(std::string data) {
    if (state_ == State::kClosed) return;
    if (!data.empty()) queue_.push_back(std::move(data));
    if (!writing_) flush();
  }

  void flush() {
    if (queue_.empty()) {
      if (response_complete_pending_) on_response_complete();
      return;
    }
    writing_ = true;
    // Everything queued goes out in one gathered write.
    n_writing_ = queue_.size();
    buffers_.clear();
    for (const auto& s : queue_) buffers_.emplace_back(s.data(), s.size());
    net::async_write(socket_, buffers_, [self = shared_from_this()](error_code ec, size_t) {
      self->writing_ = false;
      if (self->state_ == State::kClosed) return;
      if (ec) return self->client_gone();
      self->queue_.erase(self->queue_.begin(), self->queue_.begin() + static_cast<long>(self->n_writing_));
      self->flush();
    });
  }

  void on_response_complete() {
    response_complete_pending_ = false;
    request_timer_.cancel();
    finish_exchange();
    if (!keep_alive_) {
      error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      return shutdown();
    }
    if (monitoring_) {  // stop the watch read; its handler starts the next request
      monitor_stop_ = true;
      error_code ignored;
      socket_.cancel(ignored);
      return;
    }
    read_header();
  }

  void finish_exchange() {
    if (!current_) return;
    auto ex = std::move(current_);
    --server_.n_active_;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                ex->request().arrival)
                          .count();
    nlohmann::ordered_json f;
    f["method"] = ex->request().method;
    f["path"] = ex->request().path;
    f["status"] = ex->status_;
    f["bytes"] = ex->bytes_sent_;
    f["ms"] = std::round(ms * 100) / 100;
    f["peer"] = peer_;
    if (ex->closed_) f["client_closed"] = true;
    log_request(ex->status_ >= 500 ? LogLevel::kWarn : LogLevel::kInfo, ex->request_id(),
                ex->closed_ ? "request ended: client disconnected" : "request", f);
    ex->session_.reset();  // breaks the exchange <-> session cycle
  }

  // Closes the connection; an exchange still in flight hears that its client is gone.
  void shutdown() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    error_code ignored;
    read_timer_.cancel();
    request_timer_.cancel();
    socket_.close(ignored);
    if (current_) {
      auto ex = current_;
      if (!ex->complete_) ex->fire_close();
      finish_exchange();
    }
    queue_.clear();
  }

  friend class Exchange;
  static constexpr size_t kMaxPipelinedBytes = 64 << 10;

  HttpServer& server_;
  tcp::socket socket_;
  net::steady_timer read_timer_;
  net::steady_timer request_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  State state_ = State::kReadingHeader;
  std::string peer_;
  bool http11_ = true;
  bool keep_alive_ = true;
  uint64_t timer_gen_ = 0;
  bool read_timed_out_ = false;
  std::string continue_buf_;
  std::shared_ptr<Exchange> current_;
  bool start_monitor_ = false;
  bool monitoring_ = false;
  bool monitor_stop_ = false;
  std::deque<std::string> queue_;
  std::vector<net::const_buffer> buffers_;
  size_t n_writing_ = 0;
  bool writing_ = false;
  bool response_complete_pending_ = false;
};

// --- Exchange ---

Exchange::Exchange(std::shared_ptr<Session> session, HttpRequest request)
    : session_(std::move(session)), executor_(session_->executor()), request_(std::move(request)) {}

Exchange::~Exchange() = default;

void Exchange::post(std::function<void()> fn) { net::post(executor_, std::move(fn)); }

boost::asio::any_io_executor Exchange::executor() const { return executor_; }

void Exchange::respond(int status, std::string_view content_type, std::string body, Headers extra) {
  if (started_ || closed_ || !session_) return;
  started_ = complete_ = true;
  status_ = status;
  auto s = session_;  // the write may finish the exchange, which drops session_
  s->write_response(*this, status, content_type, std::move(body), extra);
}

void Exchange::begin_stream(int status, std::string_view content_type, Headers extra) {
  if (started_ || closed_ || !session_) return;
  started_ = streaming_ = true;
  status_ = status;
  auto s = session_;
  s->write_stream_head(*this, status, content_type, extra);
}

void Exchange::send(std::string data) {
  if (!streaming_ || complete_ || closed_ || !session_) return;
  auto s = session_;
  s->write_stream_data(*this, std::move(data));
}

void Exchange::end_stream() {
  if (!streaming_ || complete_ || closed_ || !session_) return;
  complete_ = true;
  auto s = session_;
  s->write_stream_end();
}

void Exchange::fire_close() {
  if (closed_) return;
  closed_ = true;
  if (auto fn = std::move(on_close_)) {
    on_close_ = nullptr;
    try {
      fn();
    } catch (...) {  // a handler's cleanup must not take the connection's strand down
    }
  }
}

void Exchange::fire_timeout() {
  if (complete_ || closed_) return;
  if (auto fn = std::move(on_timeout_)) {
    on_timeout_ = nullptr;
    try {
      fn();
      return;
    } catch (...) {
    }
  }
  ApiError e;
  e.status = 504;
  e.type = "timeout_error";
  e.message = "the request did not complete within --request-timeout";
  if (!started_) return respond(504, "application/json", error_body(e));
  if (session_) session_->close();
}

// --- HttpServer ---

HttpServer::HttpServer(HttpServerConfig config, Handler handler)
    : config_(std::move(config)), handler_(std::move(handler)), acceptor_(ioc_) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  // Thousands of connections need thousands of descriptors: raise the soft limit to the hard one.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  error_code ec;
  const auto addr = net::ip::make_address(config_.host, ec);
  if (ec) return invalid_argument("--host '" + config_.host + "' is not an IP address");
  const tcp::endpoint ep(addr, config_.port);
  const std::string where = config_.host + ":" + std::to_string(config_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (ec) return invalid_argument("cannot listen on " + where + ": " + ec.message());
  acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return invalid_argument("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  do_accept();
  int32_t n = config_.io_threads;
  if (n <= 0) n = static_cast<int32_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  for (int32_t i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  return {};
}

void HttpServer::do_accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
    if (!acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) or a transient failure: back off a little, then go on.
      PAGELLM_LOG_WARN("accept failed: %s", ec.message().c_str());
      auto t = std::make_shared<net::steady_timer>(ioc_, std::chrono::milliseconds(50));
      t->async_wait([this, t](error_code) { do_accept(); });
      return;
    }
    if (n_connections_.load() >= config_.max_connections || draining_.load()) {
      error_code ignored;
      socket.close(ignored);
    } else {
      auto s = std::make_shared<Session>(*this, std::move(socket));
      register_session(s);
      s->start();
    }
    do_accept();
  });
}

void HttpServer::register_session(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  if (sessions_.size() >= sessions_compact_at_) {
    std::erase_if(sessions_, [](const std::weak_ptr<Session>& w) { return w.expired(); });
    sessions_compact_at_ = std::max<size_t>(1024, sessions_.size() * 2);
  }
  sessions_.push_back(s);
}

void HttpServer::unregister_session(Session*) {
  // Expired entries are dropped lazily by register_session's compaction.
}

std::vector<std::shared_ptr<Session>> HttpServer::stop_accepting() {
  net::post(ioc_, [this] {
    error_code ignored;
    acceptor_.close(ignored);
  });
  std::vector<std::shared_ptr<Session>> live;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (auto& w : sessions_)
    if (auto s = w.lock()) live.push_back(std::move(s));
  return live;
}

void HttpServer::begin_drain() {
  if (draining_.exchange(true)) return;
  std::vector<std::shared_ptr<Session>> live = stop_accepting();
  for (auto& s : live) s->drain();
}

void HttpServer::stop() {
  if (stopped_.exchange(true)) return;
  draining_ = true;
  std::vector<std::shared_ptr<Session>> live = stop_accepting();
  for (auto& s : live) s->close();
  live.clear();
  // Let the closes run, then stop the threads.
  if (!threads_.empty()) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (n_connections_.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ioc_.stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

}  // namespace pagellm::server
