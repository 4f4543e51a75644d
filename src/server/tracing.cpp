#include "server/tracing.h"

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

namespace pagellm::server {
namespace {

using OJson = nlohmann::ordered_json;

// A lowercase hex digit's value, or -1 (uppercase is invalid in traceparent).
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Decodes 2 * n lowercase hex digits into `out`; false on any other character.
bool decode_hex(std::string_view s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <size_t N>
bool all_zero(const std::array<uint8_t, N>& a) {
  for (uint8_t b : a)
    if (b != 0) return false;
  return true;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::mt19937_64& id_rng() {
  // 128 bits of OS entropy per thread: two threads (or two processes started together) never
  // share a sequence.
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  return rng;
}

template <size_t N>
std::array<uint8_t, N> random_id() {
  std::array<uint8_t, N> id{};
  auto& rng = id_rng();
  do {
    for (size_t i = 0; i < N; i += 8) {
      uint64_t r = rng();
      for (size_t k = 0; k < 8 && i + k < N; ++k, r >>= 8) id[i + k] = static_cast<uint8_t>(r);
    }
  } while (all_zero(id));
  return id;
}

OJson any_value(const AttributeValue& v) {
  OJson out = OJson::object();
  if (const auto* s = std::get_if<std::string>(&v)) {
    out["stringValue"] = *s;
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    out["intValue"] = std::to_string(*i);  // int64: a decimal string in proto3 JSON
  } else if (const auto* d = std::get_if<double>(&v)) {
    out["doubleValue"] = *d;
  } else if (const auto* b = std::get_if<bool>(&v)) {
    out["boolValue"] = *b;
  } else if (const auto* a = std::get_if<std::vector<std::string>>(&v)) {
    OJson values = OJson::array();
    for (const std::string& s : *a) values.push_back(OJson{{"stringValue", s}});
    out["arrayValue"] = OJson{{"values", std::move(values)}};
  }
  return out;
}

OJson attributes_json(const std::vector<Attribute>& attrs) {
  OJson out = OJson::array();
  for (const Attribute& a : attrs) {
    if (const auto* d = std::get_if<double>(&a.value); d && !std::isfinite(*d)) continue;
    out.push_back(OJson{{"key", a.key}, {"value", any_value(a.value)}});
  }
  return out;
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view v) {
  // 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters for version 00.
  constexpr size_t kLen = 55;
  if (v.size() < kLen) return std::nullopt;
  uint8_t version = 0;
  if (!decode_hex(v.substr(0, 2), &version, 1) || version == 0xff) return std::nullopt;
  if (version == 0 ? v.size() != kLen : (v.size() > kLen && v[kLen] != '-')) return std::nullopt;
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  TraceParent p;
  if (!decode_hex(v.substr(3, 32), p.trace_id.data(), 16)) return std::nullopt;
  if (!decode_hex(v.substr(36, 16), p.span_id.data(), 8)) return std::nullopt;
  if (!decode_hex(v.substr(53, 2), &p.flags, 1)) return std::nullopt;
  if (all_zero(p.trace_id) || all_zero(p.span_id)) return std::nullopt;
  return p;
}

std::optional<TraceParent> extract_trace_parent(
    const std::vector<std::pair<std::string, std::string>>& headers) {
  const std::string* traceparent = nullptr;
  const std::string* tracestate = nullptr;
  for (const auto& [name, value] : headers) {
    if (iequals(name, "traceparent")) {
      if (traceparent) return std::nullopt;  // two parents: neither can be trusted
      traceparent = &value;
    } else if (!tracestate && iequals(name, "tracestate")) {
      tracestate = &value;
    }
  }
  if (!traceparent) return std::nullopt;
  auto p = parse_traceparent(*traceparent);
  if (p && tracestate && tracestate->size() <= 512) p->trace_state = *tracestate;
  return p;
}

TraceId new_trace_id() {
  return random_id<16>();
}
SpanId new_span_id() {
  return random_id<8>();
}

std::string to_hex(const uint8_t* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[data[i] >> 4];
    s[2 * i + 1] = kDigits[data[i] & 15];
  }
  return s;
}

std::string format_traceparent(const TraceId& trace_id, const SpanId& span_id, uint8_t flags) {
  return "00-" + to_hex(trace_id) + "-" + to_hex(span_id) + "-" + to_hex(&flags, 1);
}

TraceResource make_trace_resource(const std::string& service_name, const std::string& version) {
  TraceResource r;
  r.attributes.push_back({"service.name", service_name});
  if (!version.empty()) r.attributes.push_back({"service.version", version});
  r.attributes.push_back({"telemetry.sdk.name", std::string("pagellm")});
  r.attributes.push_back({"telemetry.sdk.language", std::string("cpp")});
  if (!version.empty()) r.attributes.push_back({"telemetry.sdk.version", version});
  r.scope_version = version;
  return r;
}

uint32_t otlp_span_flags(const Span& s) {
  uint32_t f = s.trace_flags;
  f |= 0x100;  // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: bit 9 below is meaningful
  if (s.parent_span_id && s.parent_is_remote) f |= 0x200;  // SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
  return f;
}

std::string encode_otlp_json(const TraceResource& resource, const std::vector<Span>& spans) {
  OJson out_spans = OJson::array();
  for (const Span& s : spans) {
    OJson j = OJson::object();
    j["traceId"] = to_hex(s.trace_id);
    j["spanId"] = to_hex(s.span_id);
    if (!s.trace_state.empty()) j["traceState"] = s.trace_state;
    if (s.parent_span_id) j["parentSpanId"] = to_hex(*s.parent_span_id);
    j["flags"] = otlp_span_flags(s);  // fixed32: a JSON number
    j["name"] = s.name;
    j["kind"] = static_cast<int32_t>(s.kind);
    j["startTimeUnixNano"] = std::to_string(s.start_time_unix_nano);
    j["endTimeUnixNano"] = std::to_string(s.end_time_unix_nano);
    j["attributes"] = attributes_json(s.attributes);
    if (!s.events.empty()) {
      OJson events = OJson::array();
      for (const SpanEvent& e : s.events) {
        OJson ej = {{"timeUnixNano", std::to_string(e.time_unix_nano)}, {"name", e.name}};
        if (!e.attributes.empty()) ej["attributes"] = attributes_json(e.attributes);
        events.push_back(std::move(ej));
      }
      j["events"] = std::move(events);
    }
    OJson status = OJson::object();
    if (s.status != SpanStatusCode::kUnset) status["code"] = static_cast<int32_t>(s.status);
    if (s.status == SpanStatusCode::kError && !s.status_message.empty())
      status["message"] = s.status_message;
    j["status"] = std::move(status);
    out_spans.push_back(std::move(j));
  }
  OJson scope = {{"name", resource.scope_name}};
  if (!resource.scope_version.empty()) scope["version"] = resource.scope_version;
  OJson body = {{"resourceSpans",
                 OJson::array({OJson{
                     {"resource", {{"attributes", attributes_json(resource.attributes)}}},
                     {"scopeSpans", OJson::array({OJson{{"scope", std::move(scope)},
                                                        {"spans", std::move(out_spans)}}})}}})}};
  return body.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

ClockAnchor ClockAnchor::now() {
  ClockAnchor a;
  a.steady = std::chrono::steady_clock::now();
  a.unix_nano = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  return a;
}

int64_t ClockAnchor::to_unix_nano(std::chrono::steady_clock::time_point t) const {
  return unix_nano + std::chrono::duration_cast<std::chrono::nanoseconds>(t - steady).count();
}

}  // namespace pagellm::server
