#include "server/tracing.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <nlohmann/json.hpp>

#include "server/trace_exporter.h"

namespace pagellm::server {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The W3C specification's own example.
constexpr const char* kTraceId = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr const char* kSpanId = "00f067aa0ba902b7";

std::string tp(const std::string& version, const std::string& trace, const std::string& span,
               const std::string& flags) {
  return version + "-" + trace + "-" + span + "-" + flags;
}

// --- traceparent ---

TEST(Traceparent, ParsesTheSpecExample) {
  auto p = parse_traceparent(tp("00", kTraceId, kSpanId, "01"));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(to_hex(p->trace_id), kTraceId);
  EXPECT_EQ(to_hex(p->span_id), kSpanId);
  EXPECT_EQ(p->flags, 0x01);
  EXPECT_TRUE(p->sampled());
}

TEST(Traceparent, NotSampledAndOtherFlagsAreKept) {
  auto p = parse_traceparent(tp("00", kTraceId, kSpanId, "00"));
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->sampled());
  p = parse_traceparent(tp("00", kTraceId, kSpanId, "03"));  // sampled + Level 2's random bit
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->sampled());
  EXPECT_EQ(p->flags, 0x03);
  p = parse_traceparent(tp("00", kTraceId, kSpanId, "fe"));  // unknown bits: still parsed
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->sampled());
}

TEST(Traceparent, RejectsEachMalformedCase) {
  const std::string good = tp("00", kTraceId, kSpanId, "01");
  ASSERT_EQ(good.size(), 55u);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"empty", ""},
      {"one short", good.substr(0, 54)},
      {"version 00 with more after it", good + "-00"},
      {"version 00 with a trailing character", good + "x"},
      {"version ff (forbidden)", tp("ff", kTraceId, kSpanId, "01")},
      {"version not hex", tp("0g", kTraceId, kSpanId, "01")},
      {"version uppercase hex", tp("0A", kTraceId, kSpanId, "01")},
      {"version one digit", tp("0", kTraceId, kSpanId, "01") + "0"},
      {"trace-id uppercase", tp("00", "4BF92F3577B34DA6A3CE929D0E0E4736", kSpanId, "01")},
      {"trace-id not hex", tp("00", "4bf92f3577b34da6a3ce929d0e0e473z", kSpanId, "01")},
      {"trace-id all zero", tp("00", std::string(32, '0'), kSpanId, "01")},
      {"trace-id short", tp("00", "4bf92f3577b34da6a3ce929d0e0e473", kSpanId, "01") + "0"},
      {"parent-id uppercase", tp("00", kTraceId, "00F067AA0BA902B7", "01")},
      {"parent-id not hex", tp("00", kTraceId, "00f067aa0ba902bg", "01")},
      {"parent-id all zero", tp("00", kTraceId, std::string(16, '0'), "01")},
      {"flags uppercase", tp("00", kTraceId, kSpanId, "0A")},
      {"flags not hex", tp("00", kTraceId, kSpanId, "0x")},
      {"flags one digit", tp("00", kTraceId, kSpanId, "1") + " "},
      {"leading space", " " + good.substr(0, 54)},
      {"underscore separators", "00_" + std::string(kTraceId) + "_" + kSpanId + "_01"},
      {"first separator missing", "00" + std::string(kTraceId) + "-" + kSpanId + "-01x"},
      {"future version, junk without a dash", tp("01", kTraceId, kSpanId, "01") + "x"},
  };
  for (const auto& [what, value] : bad) EXPECT_FALSE(parse_traceparent(value).has_value()) << what;
  // Each separator replaced in turn.
  for (size_t pos : {2, 35, 52}) {
    std::string s = good;
    s[pos] = '.';
    EXPECT_FALSE(parse_traceparent(s).has_value()) << "separator at " << pos;
  }
}

TEST(Traceparent, FutureVersionsAreReadAsVersion00) {
  auto p = parse_traceparent(tp("01", kTraceId, kSpanId, "01"));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(to_hex(p->trace_id), kTraceId);
  p = parse_traceparent(tp("cc", kTraceId, kSpanId, "01") + "-what-the-future-will-bring");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(to_hex(p->span_id), kSpanId);
  EXPECT_TRUE(p->sampled());
}

TEST(Traceparent, ExtractFromHeaders) {
  const std::string good = tp("00", kTraceId, kSpanId, "01");
  auto p = extract_trace_parent({{"Content-Type", "application/json"},
                                 {"TraceParent", good},
                                 {"tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(to_hex(p->trace_id), kTraceId);
  EXPECT_EQ(p->trace_state, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
  // No header; a malformed one; two of them (which to believe?).
  EXPECT_FALSE(extract_trace_parent({{"Accept", "*/*"}}).has_value());
  EXPECT_FALSE(extract_trace_parent({{"traceparent", "garbage"}}).has_value());
  EXPECT_FALSE(extract_trace_parent({{"traceparent", good}, {"traceparent", good}}).has_value());
  // tracestate beyond the specification's 512 characters is dropped, the parent kept.
  p = extract_trace_parent({{"traceparent", good}, {"tracestate", "a=" + std::string(600, 'b')}});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->trace_state, "");
}

// --- ids ---

TEST(TraceIds, RandomNonZeroAndDistinct) {
  std::set<std::string> traces, spans;
  for (int i = 0; i < 2000; ++i) {
    const std::string t = to_hex(new_trace_id()), s = to_hex(new_span_id());
    EXPECT_EQ(t.size(), 32u);
    EXPECT_EQ(s.size(), 16u);
    EXPECT_NE(t, std::string(32, '0'));
    EXPECT_NE(s, std::string(16, '0'));
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
    traces.insert(t);
    spans.insert(s);
  }
  EXPECT_EQ(traces.size(), 2000u);
  EXPECT_EQ(spans.size(), 2000u);
  // Every byte position takes many values (not, say, a counter or a clock in the high bytes).
  std::set<uint8_t> first_bytes, last_bytes;
  for (int i = 0; i < 200; ++i) {
    const TraceId id = new_trace_id();
    first_bytes.insert(id[0]);
    last_bytes.insert(id[15]);
  }
  EXPECT_GT(first_bytes.size(), 100u);
  EXPECT_GT(last_bytes.size(), 100u);
}

TEST(TraceIds, ThreadsDoNotRepeatEachOther) {
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) ids[t].push_back(to_hex(new_span_id()));
    });
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  for (const auto& v : ids) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
}

TEST(TraceIds, FormatRoundTrips) {
  const TraceId t = new_trace_id();
  const SpanId s = new_span_id();
  const std::string header = format_traceparent(t, s, kTraceFlagSampled);
  EXPECT_EQ(header.size(), 55u);
  auto p = parse_traceparent(header);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->trace_id, t);
  EXPECT_EQ(p->span_id, s);
  EXPECT_TRUE(p->sampled());
}

// --- OTLP/JSON ---

Span example_span() {
  Span s;
  auto tp_parsed = parse_traceparent(tp("00", kTraceId, kSpanId, "01"));
  s.trace_id = tp_parsed->trace_id;
  s.parent_span_id = tp_parsed->span_id;
  s.parent_is_remote = true;
  s.trace_flags = 0x01;
  s.trace_state = "rojo=1";
  s.span_id = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  s.name = "POST /v1/chat/completions";
  s.kind = SpanKind::kServer;
  s.start_time_unix_nano = 1700000000123456789;
  s.end_time_unix_nano = 1700000001987654321;
  s.set("gen_ai.request.id", std::string("chatcmpl-1"));
  s.set("gen_ai.request.max_tokens", int64_t{9007199254740993});  // > 2^53: exact only as a string
  s.set("gen_ai.request.temperature", 0.7);
  s.set("pagellm.stream", true);
  s.set("gen_ai.response.finish_reasons", std::vector<std::string>{"stop", "length"});
  s.set("not.a.number", std::nan(""));  // left out: JSON has no NaN
  SpanEvent e;
  e.time_unix_nano = 1700000000500000000;
  e.name = "preempted";
  e.attributes.push_back({"pagellm.prompt_index", int64_t{0}});
  s.events.push_back(e);
  s.status = SpanStatusCode::kError;
  s.status_message = "engine failed";
  return s;
}

TEST(OtlpJson, EncodesASpanFieldByField) {
  TraceResource r = make_trace_resource("my-service", "1.2.3");
  const Json got = Json::parse(encode_otlp_json(r, {example_span()}));
  const Json want = Json::parse(R"({
    "resourceSpans": [{
      "resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "my-service"}},
        {"key": "service.version", "value": {"stringValue": "1.2.3"}},
        {"key": "telemetry.sdk.name", "value": {"stringValue": "pagellm"}},
        {"key": "telemetry.sdk.language", "value": {"stringValue": "cpp"}},
        {"key": "telemetry.sdk.version", "value": {"stringValue": "1.2.3"}}
      ]},
      "scopeSpans": [{
        "scope": {"name": "pagellm.server", "version": "1.2.3"},
        "spans": [{
          "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
          "spanId": "0123456789abcdef",
          "traceState": "rojo=1",
          "parentSpanId": "00f067aa0ba902b7",
          "flags": 769,
          "name": "POST /v1/chat/completions",
          "kind": 2,
          "startTimeUnixNano": "1700000000123456789",
          "endTimeUnixNano": "1700000001987654321",
          "attributes": [
            {"key": "gen_ai.request.id", "value": {"stringValue": "chatcmpl-1"}},
            {"key": "gen_ai.request.max_tokens", "value": {"intValue": "9007199254740993"}},
            {"key": "gen_ai.request.temperature", "value": {"doubleValue": 0.7}},
            {"key": "pagellm.stream", "value": {"boolValue": true}},
            {"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": [
              {"stringValue": "stop"}, {"stringValue": "length"}]}}}
          ],
          "events": [{
            "timeUnixNano": "1700000000500000000",
            "name": "preempted",
            "attributes": [{"key": "pagellm.prompt_index", "value": {"intValue": "0"}}]
          }],
          "status": {"code": 2, "message": "engine failed"}
        }]
      }]
    }]
  })");
  EXPECT_EQ(got, want) << got.dump(2);
}

TEST(OtlpJson, RootSpanUnsetStatusAndBadUtf8) {
  Span s;
  s.trace_id = new_trace_id();
  s.span_id = new_span_id();
  s.name = "POST /v1/completions";
  s.start_time_unix_nano = 1;
  s.end_time_unix_nano = 2;
  s.set("x", std::string("ok\xff"));
  const Json got = Json::parse(encode_otlp_json(make_trace_resource("svc", ""), {s, s}));
  const Json& spans = got["resourceSpans"][0]["scopeSpans"][0]["spans"];
  ASSERT_EQ(spans.size(), 2u);
  const Json& j = spans[0];
  EXPECT_FALSE(j.contains("parentSpanId"));
  EXPECT_FALSE(j.contains("traceState"));
  EXPECT_FALSE(j.contains("events"));
  EXPECT_EQ(j["flags"], 0x101);  // sampled; the parent is known not to be remote (there is none)
  EXPECT_EQ(j["status"], Json::object());
  EXPECT_EQ(j["attributes"][0]["value"]["stringValue"], "ok\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(got["resourceSpans"][0]["scopeSpans"][0]["scope"], Json({{"name", "pagellm.server"}}));
  EXPECT_EQ(got["resourceSpans"][0]["resource"]["attributes"].size(), 3u);
}

TEST(ClockAnchor, MapsSteadyToUnixTime) {
  const ClockAnchor a = ClockAnchor::now();
  const auto later = a.steady + std::chrono::milliseconds(1500);
  EXPECT_EQ(a.to_unix_nano(later) - a.unix_nano, 1500000000);
  // Roughly now (2023 or later).
  EXPECT_GT(a.unix_nano, int64_t{1700000000} * 1000000000);
}

// --- endpoint ---

TEST(OtlpEndpoint, ParsesHttpUrls) {
  auto e = parse_otlp_endpoint("http://localhost:4318/v1/traces");
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->host, "localhost");
  EXPECT_EQ(e->port, "4318");
  EXPECT_EQ(e->target, "/v1/traces");
  EXPECT_EQ(e->host_header, "localhost:4318");
  e = parse_otlp_endpoint("http://collector/v1/traces?tenant=a#frag");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->port, "80");
  EXPECT_EQ(e->target, "/v1/traces?tenant=a");
  e = parse_otlp_endpoint("http://127.0.0.1:4318");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->target, "/");
  e = parse_otlp_endpoint("http://[::1]:4318/v1/traces");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->host_header, "[::1]:4318");
}

TEST(OtlpEndpoint, RefusesWhatItCannotUse) {
  for (const char* bad :
       {"https://collector:4318/v1/traces", "grpc://collector:4317", "collector:4318", "",
        "http://", "http://:4318/v1/traces", "http://host:0/", "http://host:70000/",
        "http://host:12ab/", "http://user@host/", "http://[::1/"}) {
    auto e = parse_otlp_endpoint(bad);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_NE(e.status().message().find("--otlp-traces-endpoint"), std::string::npos);
    }
  }
  auto e = parse_otlp_endpoint("https://collector:4318/v1/traces");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("https is not supported"), std::string::npos);
}

// --- exporter, against a collector on loopback ---

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// A minimal OTLP/HTTP receiver: answers each request with the status `status_of(i)` gives the
// i-th (429/503 with Retry-After: 0), and keeps what it received.
class Receiver {
 public:
  struct Request {
    std::string target, content_type, body;
  };

  explicit Receiver(
      std::function<int(int)> status_of = [](int) { return 200; },
      bool close_after_response = false)
      : status_of_(std::move(status_of)),
        close_after_response_(close_after_response),
        acceptor_(ioc_, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }
  ~Receiver() {
    stop_ = true;
    boost::system::error_code ec;
    tcp::socket poke(ioc_);
    poke.connect(acceptor_.local_endpoint(), ec);  // unblocks accept()
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/traces"; }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int n_spans() {
    int n = 0;
    for (const Request& r : requests()) {
      const Json j = Json::parse(r.body);
      n += static_cast<int>(j["resourceSpans"][0]["scopeSpans"][0]["spans"].size());
    }
    return n;
  }

 private:
  void serve() {
    while (!stop_) {
      tcp::socket sock(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(sock, ec);
      if (ec || stop_) break;
      beast::flat_buffer buf;
      while (true) {
        http::request<http::string_body> req;
        http::read(sock, buf, req, ec);
        if (ec) break;
        int i = 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(
              {std::string(req.target()), std::string(req[http::field::content_type]), req.body()});
          i = static_cast<int>(requests_.size()) - 1;
        }
        const int status = status_of_(i);
        http::response<http::string_body> res{static_cast<http::status>(status), 11};
        res.set(http::field::content_type, "application/json");
        if (status == 429 || status == 503) res.set(http::field::retry_after, "0");
        res.body() = status == 200 ? "{}" : R"({"message":"not now"})";
        res.keep_alive(req.keep_alive());
        res.prepare_payload();
        http::write(sock, res, ec);
        if (ec || close_after_response_) break;
      }
    }
  }

  std::function<int(int)> status_of_;
  bool close_after_response_ = false;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Request> requests_;
  std::thread thread_;
};

// A port with nothing listening (bound then released).
uint16_t closed_port() {
  net::io_context ioc;
  tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

Span small_span(int i) {
  Span s;
  s.trace_id = new_trace_id();
  s.span_id = new_span_id();
  s.name = "span " + std::to_string(i);
  s.start_time_unix_nano = 1;
  s.end_time_unix_nano = 2;
  return s;
}

bool wait_until(const std::function<bool()>& pred, double seconds = 10) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(TraceExporter, BatchesAndPostsJson) {
  Receiver rx;
  TracingConfig c;
  c.endpoint = rx.url();
  c.service_name = "unit";
  c.max_export_batch_size = 2;
  c.schedule_delay_s = 0.05;
  auto e = TraceExporter::create(c, "9.9.9");
  ASSERT_TRUE(e.ok()) << e.status().message();
  for (int i = 0; i < 5; ++i) (*e)->submit(small_span(i));
  ASSERT_TRUE(wait_until([&] { return rx.n_spans() == 5; })) << rx.n_spans();
  const auto reqs = rx.requests();
  EXPECT_GE(reqs.size(), 3u);  // batches of at most 2
  for (const auto& r : reqs) {
    EXPECT_EQ(r.target, "/v1/traces");
    EXPECT_EQ(r.content_type, "application/json");
    const Json j = Json::parse(r.body);
    EXPECT_LE(j["resourceSpans"][0]["scopeSpans"][0]["spans"].size(), 2u);
    EXPECT_EQ(j["resourceSpans"][0]["resource"]["attributes"][0],
              Json({{"key", "service.name"}, {"value", {{"stringValue", "unit"}}}}));
  }
  ASSERT_TRUE(wait_until([&] { return (*e)->stats().exported == 5; }));
  (*e)->shutdown(1);
  EXPECT_EQ((*e)->stats().dropped_queue + (*e)->stats().dropped_export, 0);
}

TEST(TraceExporter, RetriesThrottlingThenSucceeds) {
  Receiver rx([](int i) { return i == 0 ? 503 : i == 1 ? 429 : 200; });
  TracingConfig c;
  c.endpoint = rx.url();
  c.schedule_delay_s = 0;
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  (*e)->submit(small_span(0));
  ASSERT_TRUE(wait_until([&] { return (*e)->stats().exported == 1; }));
  const auto reqs = rx.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].body, reqs[2].body);  // the same batch, sent again
  EXPECT_EQ((*e)->stats().dropped_export, 0);
}

TEST(TraceExporter, DoesNotRetryABadRequest) {
  Receiver rx([](int) { return 400; });
  TracingConfig c;
  c.endpoint = rx.url();
  c.schedule_delay_s = 0;
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  (*e)->submit(small_span(0));
  ASSERT_TRUE(wait_until([&] { return (*e)->stats().dropped_export == 1; }));
  (*e)->shutdown(1);
  EXPECT_EQ(rx.requests().size(), 1u);
  EXPECT_EQ((*e)->stats().exported, 0);
}

TEST(TraceExporter, GivesUpAfterMaxRetries) {
  Receiver rx([](int) { return 503; });
  TracingConfig c;
  c.endpoint = rx.url();
  c.schedule_delay_s = 0;
  c.max_retries = 2;
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  (*e)->submit(small_span(0));
  ASSERT_TRUE(wait_until([&] { return (*e)->stats().dropped_export == 1; }));
  EXPECT_EQ(rx.requests().size(), 3u);  // the first try and two retries
}

TEST(TraceExporter, FullQueueDropsAndCountsWithoutBlocking) {
  TracingConfig c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(closed_port()) + "/v1/traces";
  c.max_queue_size = 3;
  c.max_export_batch_size = 100;
  c.schedule_delay_s = 30;  // nothing leaves before shutdown
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) (*e)->submit(small_span(i));
  EXPECT_LT(seconds_since(t0), 0.5);
  EXPECT_EQ((*e)->stats().dropped_queue, 7);
  (*e)->shutdown(0.5);
  const TraceExportStats st = (*e)->stats();
  EXPECT_EQ(st.exported, 0);
  EXPECT_EQ(st.dropped_queue + st.dropped_export, 10);
  (*e)->submit(small_span(99));  // after shutdown: dropped, not queued
  EXPECT_EQ((*e)->stats().dropped_queue + (*e)->stats().dropped_export, 11);
}

TEST(TraceExporter, ShutdownFlushesWhatIsQueued) {
  Receiver rx;
  TracingConfig c;
  c.endpoint = rx.url();
  c.schedule_delay_s = 30;  // only the shutdown sends it
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  (*e)->submit(small_span(0));
  (*e)->submit(small_span(1));
  (*e)->shutdown(5);
  EXPECT_EQ((*e)->stats().exported, 2);
  EXPECT_EQ(rx.n_spans(), 2);
}

TEST(TraceExporter, ShutdownLimitCutsAHungCollectorShort) {
  // A collector that accepts connections (the kernel's backlog) and never answers.
  net::io_context ioc;
  tcp::acceptor hung(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  TracingConfig c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(hung.local_endpoint().port()) + "/v1/traces";
  c.schedule_delay_s = 0;
  c.export_timeout_s = 60;
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  (*e)->submit(small_span(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the POST is in flight
  const auto t0 = Clock::now();
  (*e)->shutdown(0.3);
  EXPECT_LT(seconds_since(t0), 1.5);
  EXPECT_EQ((*e)->stats().dropped_export + (*e)->stats().dropped_queue, 1);
}

TEST(TraceExporter, ReplacesAConnectionTheCollectorClosed) {
  // The collector closes each connection after its response without saying so (as one does
  // after an idle timeout): the next batch finds the kept-alive connection dead and is sent again
  // on a fresh one, not counted as a failure.
  Receiver rx([](int) { return 200; }, /*close_after_response=*/true);
  TracingConfig c;
  c.endpoint = rx.url();
  c.schedule_delay_s = 0;
  c.max_retries = 0;  // the fresh connection is not a retry
  auto e = TraceExporter::create(c, "1");
  ASSERT_TRUE(e.ok());
  for (int i = 0; i < 3; ++i) {
    (*e)->submit(small_span(i));
    ASSERT_TRUE(wait_until([&] { return (*e)->stats().exported == i + 1; })) << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the close reaches the client
  }
  EXPECT_EQ((*e)->stats().dropped_export, 0);
  EXPECT_EQ(rx.n_spans(), 3);
}

}  // namespace
}  // namespace pagellm::server
