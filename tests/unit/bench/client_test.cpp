// The load generator against a scripted SSE server on 127.0.0.1 (a thread per connection, raw
// socket writes so that chunk timing and failures are exactly what the test says).
#include "bench/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "bench/arrival.h"

namespace pagellm::bench {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

enum class Mode { kOk, kStall, kDrop, kStatus500, kMalformed, kNotStreamed };

struct Script {
  Mode mode = Mode::kOk;
  double first_delay_s = 0.1;  // headers go out at once; the first token after this
  double gap_s = 0.05;         // between later tokens
  int n_tokens = 5;
  bool chunked = false;        // Transfer-Encoding: chunked and keep-alive (else close-delimited)
};

class FakeServer {
 public:
  explicit FakeServer(Script s) : script_(s), acceptor_(ioc_, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~FakeServer() {
    stop_ = true;
    {
      // A blocking accept() is not woken by closing the acceptor from another thread: connect
      // once so that the accept loop sees stop_.
      boost::system::error_code ec;
      net::io_context ioc;
      tcp::socket poke(ioc);
      poke.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
    }
    accept_thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : conns_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return n_conns_; }
  nlohmann::json last_body() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_body_;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      boost::system::error_code ec;
      tcp::socket s(ioc_);
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      ++n_conns_;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.emplace_back([this, sock = std::move(s)]() mutable { serve(std::move(sock)); });
    }
  }

  bool sleep_s(double s) {  // false when the server is stopping
    const auto until = Clock::now() + std::chrono::duration<double>(s);
    while (Clock::now() < until) {
      if (stop_) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  bool send(tcp::socket& s, const std::string& data) {
    boost::system::error_code ec;
    std::string framed = data;
    if (script_.chunked) {
      char head[32];
      std::snprintf(head, sizeof head, "%zx\r\n", data.size());
      framed = head + data + "\r\n";
    }
    net::write(s, net::buffer(framed), ec);
    return !ec;
  }

  void serve(tcp::socket s) {
    s.set_option(tcp::no_delay(true));  // one write, one segment: the test times each chunk
    net::streambuf buf;
    for (;;) {
      boost::system::error_code ec;
      const size_t head = net::read_until(s, buf, "\r\n\r\n", ec);
      if (ec) return;
      std::string headers(net::buffers_begin(buf.data()), net::buffers_begin(buf.data()) + head);
      buf.consume(head);
      size_t len = 0;
      if (auto p = headers.find("Content-Length: "); p != std::string::npos) len = std::stoul(headers.substr(p + 16));
      if (buf.size() < len) net::read(s, buf, net::transfer_exactly(len - buf.size()), ec);
      std::string body(net::buffers_begin(buf.data()), net::buffers_begin(buf.data()) + len);
      buf.consume(len);
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_body_ = nlohmann::json::parse(body, nullptr, false);
      }
      if (!respond(s)) return;
      if (!script_.chunked) return;
    }
  }

  bool respond(tcp::socket& s) {
    boost::system::error_code ec;
    if (script_.mode == Mode::kStatus500) {
      const std::string b = R"({"error":{"message":"boom","type":"internal_error"}})";
      net::write(s, net::buffer("HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                "Connection: close\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b), ec);
      return false;
    }
    if (script_.mode == Mode::kNotStreamed) {  // a server that ignores "stream": true
      const std::string b = R"({"choices":[{"index":0,"text":"abc","finish_reason":"length"}]})";
      net::write(s, net::buffer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b), ec);
      return false;
    }
    std::string h = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";
    h += script_.chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "Connection: close\r\n\r\n";
    net::write(s, net::buffer(h), ec);
    if (ec) return false;
    for (int i = 0; i < script_.n_tokens; ++i) {
      if (!sleep_s(i == 0 ? script_.first_delay_s : script_.gap_s)) return false;
      if (script_.mode == Mode::kMalformed && i == 1) return send(s, "data: {not json\n\n") && sleep_s(5);
      if (script_.mode == Mode::kStall && i == 2) return sleep_s(5) && false;
      if (script_.mode == Mode::kDrop && i == 2) return false;  // the socket closes on return
      nlohmann::json c = {{"choices", {{{"index", 0}, {"text", "t" + std::to_string(i)}, {"finish_reason", nullptr}}}}};
      if (!send(s, "data: " + c.dump() + "\n\n")) return false;
    }
    nlohmann::json fin = {{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}};
    nlohmann::json usage = {{"choices", nlohmann::json::array()},
                            {"usage", {{"prompt_tokens", 11}, {"completion_tokens", script_.n_tokens}}}};
    if (!send(s, "data: " + fin.dump() + "\n\n: ping\n\ndata: " + usage.dump() + "\n\ndata: [DONE]\n\n")) return false;
    if (script_.chunked) net::write(s, net::buffer(std::string("0\r\n\r\n")), ec);
    return !ec;
  }

  Script script_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> n_conns_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
  nlohmann::json last_body_;
};

std::vector<BenchRequest> requests(size_t n) {
  BenchRequest r;
  r.prompt_ids = {101, 102, 103};
  r.prompt_len = 3;
  r.max_tokens = 5;
  return std::vector<BenchRequest>(n, r);
}

ClientOptions options(const FakeServer& s) {
  ClientOptions o;
  o.base_url = s.url();
  o.model = "fake";
  o.timeout_s = 5;
  o.stall_timeout_s = 0.3;
  return o;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Timing tolerance: the measured value can only be later than the script (the client sees a
// chunk after the server sleeps), by scheduling and loopback latency; 40 ms covers a loaded
// 2-core machine, a tenth of what a broken measurement (a missed or merged chunk) would be off.
constexpr double kLateTol = 0.040;
constexpr double kEarlyTol = 0.002;

TEST(Client, MeasuresScriptedTtftAndItl) {
  FakeServer srv({Mode::kOk, 0.12, 0.05, 5, false});
  auto r = run_load(options(srv), requests(3), {0.0, 0.0, 0.0});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const RequestResult& q : r->results) {
    ASSERT_TRUE(q.ok) << q.error_kind << ": " << q.error_detail;
    EXPECT_EQ(q.output_tokens, 5);  // from usage
    EXPECT_EQ(q.prompt_tokens, 11);
    EXPECT_GE(q.ttft_s, 0.12 - kEarlyTol);
    EXPECT_LE(q.ttft_s, 0.12 + kLateTol);
    ASSERT_EQ(q.itl_s.size(), 4u);
    double last_token_s = q.ttft_s;
    for (double g : q.itl_s) {
      EXPECT_GE(g, 0.05 - kLateTol / 2);  // a late previous chunk shortens the next gap a little
      EXPECT_LE(g, 0.05 + kLateTol);
      last_token_s += g;
    }
    // The server sleeps before each chunk, so its lateness adds up over five sleeps: the end-to-end
    // bound is the script's sum from below, and from above the measured last token plus the final
    // chunks (sent at once after it), which a dropped or merged chunk would still break.
    EXPECT_GE(q.latency_s, 0.12 + 4 * 0.05 - kEarlyTol);
    EXPECT_GE(q.latency_s, last_token_s - kEarlyTol);
    EXPECT_LE(q.latency_s, last_token_s + kLateTol);
  }
  const nlohmann::json body = srv.last_body();
  EXPECT_EQ(body["model"], "fake");
  EXPECT_EQ(body["prompt"], nlohmann::json({101, 102, 103}));
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["max_tokens"], 5);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  BenchMetrics m = compute_metrics(r->results, r->duration_s, Slo{});
  EXPECT_EQ(m.completed, 3);
  EXPECT_NEAR(m.tpot_ms.mean, 50.0, kLateTol * 1e3);
}

TEST(Client, OpenLoopHonoursSendTimesAndConcurrencyCap) {
  FakeServer srv({Mode::kOk, 0.05, 0.01, 3, false});
  ClientOptions o = options(srv);
  o.max_concurrency = 1;
  const auto t0 = Clock::now();
  auto r = run_load(o, requests(4), {0.0, 0.0, 0.0, 0.3});
  ASSERT_TRUE(r.ok());
  const double wall = since(t0);
  for (const RequestResult& q : r->results) ASSERT_TRUE(q.ok) << q.error_kind;
  // One at a time: each starts after the previous one ended (~70 ms each).
  EXPECT_GE(r->results[1].start_s, r->results[0].start_s + r->results[0].latency_s - kEarlyTol);
  EXPECT_GE(r->results[2].start_s, r->results[1].start_s + r->results[1].latency_s - kEarlyTol);
  EXPECT_GE(r->results[3].start_s, 0.3 - kEarlyTol);  // the scheduled send time
  EXPECT_LE(r->results[3].start_s, 0.3 + kLateTol);
  EXPECT_LT(wall, 1.0);
}

TEST(Client, KeepAliveReusesConnections) {
  FakeServer srv({Mode::kOk, 0.0, 0.0, 4, true});
  ClientOptions o = options(srv);
  o.keep_alive = true;
  o.max_concurrency = 1;
  auto r = run_load(o, requests(5), std::vector<double>(5, 0.0));
  ASSERT_TRUE(r.ok());
  for (const RequestResult& q : r->results) {
    ASSERT_TRUE(q.ok) << q.error_kind << ": " << q.error_detail;
    EXPECT_EQ(q.output_tokens, 4);
  }
  EXPECT_EQ(srv.connections(), 1);
}

struct FailureCase {
  Mode mode;
  const char* kind;
};

TEST(Client, FailuresAreClassifiedInBoundedTime) {
  for (FailureCase c : {FailureCase{Mode::kStall, "stalled"}, FailureCase{Mode::kDrop, "dropped"},
                        FailureCase{Mode::kStatus500, "http_500"}, FailureCase{Mode::kMalformed, "malformed_sse"},
                        FailureCase{Mode::kNotStreamed, "malformed_sse"}}) {
    FakeServer srv({c.mode, 0.01, 0.01, 5, false});
    const auto t0 = Clock::now();
    auto r = run_load(options(srv), requests(2), {0.0, 0.0});
    ASSERT_TRUE(r.ok());
    EXPECT_LT(since(t0), 2.0) << c.kind;  // stall timeout 0.3 s, deadline 5 s
    for (const RequestResult& q : r->results) {
      EXPECT_FALSE(q.ok) << c.kind;
      EXPECT_EQ(q.error_kind, c.kind) << q.error_detail;
    }
  }
}

TEST(Client, RefusedConnectionAndDeadline) {
  unsigned short port = 0;
  {
    net::io_context ioc;
    tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }  // closed: nothing listens there now
  ClientOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.timeout_s = 2;
  auto r = run_load(o, requests(3), {0.0, 0.0, 0.0});
  ASSERT_TRUE(r.ok());
  for (const RequestResult& q : r->results) EXPECT_EQ(q.error_kind, "connect") << q.error_detail;

  // A stream slower than the deadline (but never silent for the stall timeout) is a "timeout".
  FakeServer srv({Mode::kOk, 0.05, 0.1, 50, false});
  ClientOptions d = options(srv);
  d.timeout_s = 0.4;
  const auto t0 = Clock::now();
  auto slow = run_load(d, requests(1), {0.0});
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(slow->results[0].error_kind, "timeout") << slow->results[0].error_detail;
  EXPECT_LT(since(t0), 1.0);
}

TEST(Client, BaseUrl) {
  auto e = parse_base_url("http://localhost:8000/api/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "localhost");
  EXPECT_EQ(e->port, "8000");
  EXPECT_EQ(e->prefix, "/api");
  EXPECT_EQ(parse_base_url("http://[::1]:9")->host, "::1");
  EXPECT_EQ(parse_base_url("http://h")->port, "80");
  EXPECT_FALSE(parse_base_url("https://h").ok());
  EXPECT_FALSE(parse_base_url("h:80").ok());
  EXPECT_FALSE(parse_base_url("http://h:99999").ok());
}

TEST(Client, HttpGet) {
  FakeServer srv({Mode::kStatus500, 0, 0, 1, false});
  auto r = http_get(srv.url(), "/metrics", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("HTTP 500"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace pagellm::bench
