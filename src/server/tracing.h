// Distributed tracing, the data side: W3C Trace Context (the `traceparent` request header), span
// and trace ids, and one request's span encoded as OTLP/JSON (an ExportTraceServiceRequest, as
// opentelemetry-proto's trace.proto defines it and docs/specification.md maps it to JSON).
// Nothing here does I/O; trace_exporter.h sends the encoded batches.
//
// OTLP/JSON is the proto3 JSON mapping with these deviations (the specification's words):
// traceId/spanId/parentSpanId are hex strings, not base64; enums are integers (kind 2 = SERVER,
// status code 2 = ERROR); keys are lowerCamelCase. 64-bit integers (times, intValue) are decimal
// strings, as proto3 JSON writes int64/fixed64.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace pagellm::server {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// trace-flags bit 0 (W3C Trace Context): the caller may have recorded its span; we export ours.
inline constexpr uint8_t kTraceFlagSampled = 0x01;

// A parent's context, as read from a valid `traceparent` (and `tracestate`) header.
struct TraceParent {
  TraceId trace_id{};
  SpanId span_id{};  // the caller's span: our span's parent
  uint8_t flags = 0;
  std::string trace_state;  // `tracestate` as received (passed on, not interpreted); may be ""
  bool sampled() const { return (flags & kTraceFlagSampled) != 0; }
};

// Parses a `traceparent` value by W3C Trace Context (Level 1, section 3.2):
//   version "-" trace-id "-" parent-id "-" trace-flags, each lowercase hex (2, 32, 16, 2 digits).
// Version 00 is exactly 55 characters. Version ff is invalid. A later version (01..fe) is read as
// 00 is, and may carry more fields after a '-' at offset 55. An all-zero trace-id or parent-id is
// invalid. Returns nullopt for anything else: the caller then starts a new trace.
std::optional<TraceParent> parse_traceparent(std::string_view value);

// The parent named by a request's headers: `traceparent` if exactly one is present and valid,
// with the first `tracestate` (at most 512 characters, the spec's limit; longer is dropped).
std::optional<TraceParent> extract_trace_parent(
    const std::vector<std::pair<std::string, std::string>>& headers);

// New random ids: never all-zero (invalid in W3C and OTLP). A per-thread 64-bit generator seeded
// from std::random_device (the OS's entropy), so ids from separate processes or threads do not
// collide the way a time-seeded rand() would.
TraceId new_trace_id();
SpanId new_span_id();

std::string to_hex(const uint8_t* data, size_t n);
template <size_t N>
std::string to_hex(const std::array<uint8_t, N>& id) {
  return to_hex(id.data(), N);
}
// The `traceparent` header naming (trace_id, span_id, flags), version 00.
std::string format_traceparent(const TraceId& trace_id, const SpanId& span_id, uint8_t flags);

// An attribute value: string, int64 (intValue), double (doubleValue), bool, or an array of
// strings (arrayValue, e.g. gen_ai.response.finish_reasons).
using AttributeValue = std::variant<std::string, int64_t, double, bool, std::vector<std::string>>;

struct Attribute {
  std::string key;
  AttributeValue value;
};

struct SpanEvent {
  int64_t time_unix_nano = 0;
  std::string name;
  std::vector<Attribute> attributes;
};

// trace.proto Span.SpanKind and Status.StatusCode values.
enum class SpanKind : int32_t { kInternal = 1, kServer = 2, kClient = 3 };
enum class SpanStatusCode : int32_t { kUnset = 0, kOk = 1, kError = 2 };

// One finished span, ready to encode.
struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  std::optional<SpanId> parent_span_id;  // absent: a root span
  bool parent_is_remote = false;         // the parent came from a request header
  uint8_t trace_flags = kTraceFlagSampled;
  std::string trace_state;
  std::string name;
  SpanKind kind = SpanKind::kServer;
  int64_t start_time_unix_nano = 0;
  int64_t end_time_unix_nano = 0;
  std::vector<Attribute> attributes;
  std::vector<SpanEvent> events;
  SpanStatusCode status = SpanStatusCode::kUnset;
  std::string status_message;  // only with kError

  void set(std::string key, AttributeValue value) {
    attributes.push_back({std::move(key), std::move(value)});
  }
};

// Who sends the spans: the resource (service.name, ...) and the instrumentation scope.
struct TraceResource {
  std::vector<Attribute> attributes;  // service.name first
  std::string scope_name = "pagellm.server";
  std::string scope_version;
};

// The resource's attributes for a service: service.name, telemetry.sdk.{name,language,version}.
TraceResource make_trace_resource(const std::string& service_name, const std::string& version);

// Span.flags (trace.proto): the W3C trace flags in bits 0-7, and bits 8 and 9 saying whether the
// parent is remote (SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK).
uint32_t otlp_span_flags(const Span& s);

// The body of one OTLP/HTTP JSON export: {"resourceSpans": [{resource, scopeSpans: [{scope,
// spans}]}]}. Non-finite doubles are left out (JSON has no NaN); strings that are not valid UTF-8
// have the bad bytes replaced.
std::string encode_otlp_json(const TraceResource& resource, const std::vector<Span>& spans);

// steady_clock (what the server measures with) -> Unix time in nanoseconds, through one reading
// of both clocks taken by the caller.
struct ClockAnchor {
  std::chrono::steady_clock::time_point steady;
  int64_t unix_nano = 0;
  static ClockAnchor now();
  int64_t to_unix_nano(std::chrono::steady_clock::time_point t) const;
};

}  // namespace pagellm::server
