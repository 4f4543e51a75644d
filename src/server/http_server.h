// HttpServer: the transport under the OpenAI API. Asynchronous HTTP/1.1 on Boost.Beast/Asio: a
// few I/O threads multiplex every connection (no thread per connection or per request), keep-alive,
// limits (body size, header size, connection count), timeouts (idle/slow header, slow body,
// whole request), request ids, CORS, access logs, and a graceful drain. It knows nothing about
// models: each complete request goes to the handler as an Exchange, which the handler answers
// with one response or a chunked stream, from any thread, through Exchange::post().
//
// Connection life:  read header (header_timeout) -> [100 Continue] -> read body (read_timeout)
//   -> dispatch to the handler (request_timeout starts; the socket is watched for the client
//   going away) -> response written -> next request on the same connection, or close.
// A client that disconnects before its response is complete fires the exchange's close
// callback, so the handler can abort the work at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "core/status.h"

namespace pagellm::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;             // 0: an ephemeral port (see HttpServer::port())
  int32_t io_threads = 0;           // 0: min(4, hardware threads)
  int64_t max_body_bytes = 8 << 20;
  int32_t max_header_bytes = 16 << 10;
  int32_t max_connections = 8192;   // beyond it new connections wait in the kernel backlog
  double header_timeout_s = 60;     // an idle keep-alive connection, or a slow request header
  double read_timeout_s = 30;       // the body, once the header is in (slowloris bound)
  double request_timeout_s = 0;     // dispatch -> response complete; 0 = none
  std::string cors_origin;          // "" = no CORS; "*" or comma-separated origins
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;
  Headers headers;     // as received (names in their original case)
  std::string body;
  std::string request_id;  // X-Request-Id as received (if well-formed) or generated
  std::string peer;        // "ip:port"
  std::chrono::steady_clock::time_point arrival;  // the header was complete

  // The first header named `name` (case-insensitive), or "".
  std::string_view header(std::string_view name) const;
};

class Session;

// One request and its response. Every method except request() and post() must run on the
// exchange's strand: in the handler call itself, or inside a function given to post().
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<Session> session, HttpRequest request);
  ~Exchange();

  const HttpRequest& request() const { return request_; }
  const std::string& request_id() const { return request_.request_id; }
  // Runs `fn` on this exchange's strand (from any thread).
  void post(std::function<void()> fn);
  boost::asio::any_io_executor executor() const;

  // A complete response. X-Request-Id, Content-Length, Connection and CORS headers are added.
  void respond(int status, std::string_view content_type, std::string body, Headers extra = {});
  // A streamed response: the header now (chunked transfer), then send() per piece, then
  // end_stream(). On a HTTP/1.0 connection the body is sent raw and the connection closed.
  void begin_stream(int status, std::string_view content_type, Headers extra = {});
  void send(std::string data);
  void end_stream();

  // Called once if the client goes away (or the connection fails) before the response is
  // complete. Not called after a complete response.
  void on_close(std::function<void()> fn) { on_close_ = std::move(fn); }
  // Called once if request_timeout passes before the response is complete; the handler should
  // stop its work and finish the response (e.g. with an error). Without one, the server answers
  // 504 (or ends the stream) itself.
  void on_timeout(std::function<void()> fn) { on_timeout_ = std::move(fn); }

  bool started() const { return started_; }  // a response (or stream header) was sent
  bool complete() const { return complete_; }
  bool closed() const { return closed_; }    // the client went away
  int status() const { return status_; }

 private:
  friend class Session;
  void fire_close();
  void fire_timeout();

  std::shared_ptr<Session> session_;  // reset once the exchange is finished or closed
  boost::asio::any_io_executor executor_;  // the connection's strand
  HttpRequest request_;
  std::function<void()> on_close_;
  std::function<void()> on_timeout_;
  bool started_ = false;
  bool streaming_ = false;
  bool complete_ = false;
  bool closed_ = false;
  int status_ = 0;
  int64_t bytes_sent_ = 0;
};

using Handler = std::function<void(std::shared_ptr<Exchange>)>;

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, Handler handler);
  ~HttpServer();

  // Binds and listens (errors name the address), then starts the I/O threads.
  Status start();
  uint16_t port() const { return port_; }
  const HttpServerConfig& config() const { return config_; }
  boost::asio::io_context& io_context() { return ioc_; }

  // Stops accepting, closes idle keep-alive connections and marks busy ones to close after their
  // response. In-flight exchanges go on.
  void begin_drain();
  bool draining() const { return draining_.load(); }
  // Exchanges dispatched and not yet complete or closed.
  int64_t n_active() const { return n_active_.load(); }
  int64_t n_connections() const { return n_connections_.load(); }
  // Closes every connection and stops the I/O threads (joins them).
  void stop();

 private:
  friend class Session;
  friend class Exchange;
  void do_accept();
  void register_session(const std::shared_ptr<Session>& s);
  void unregister_session(Session* s);
  // begin_drain's and stop's first step: the acceptor closes (on the I/O threads) and the live
  // sessions are returned, to be drained or closed.
  std::vector<std::shared_ptr<Session>> stop_accepting();

  // Declared before ioc_: sessions destroyed while the io_context is torn down still use them.
  HttpServerConfig config_;
  Handler handler_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> n_active_{0};
  std::atomic<int64_t> n_connections_{0};
  std::mutex sessions_mu_;
  std::vector<std::weak_ptr<Session>> sessions_;  // expired entries compacted when it doubles
  size_t sessions_compact_at_ = 1024;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
};

// A random 32-hex-digit id (request ids, completion ids).
std::string random_hex_id();
// The reason phrase of an HTTP status ("Not Found").
std::string_view status_reason(int status);

}  // namespace pagellm::server
