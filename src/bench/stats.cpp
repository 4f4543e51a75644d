#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "core/check.h"

namespace pagellm::bench {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  PAGELLM_CHECK(!sorted.empty());
  // numpy "linear": virtual index (n - 1) * q / 100, interpolate between its neighbours.
  const double pos = (static_cast<double>(sorted.size()) - 1.0) * std::clamp(q, 0.0, 100.0) / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.n = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.p50 = percentile_sorted(values, 50);
  s.p90 = percentile_sorted(values, 90);
  s.p99 = percentile_sorted(values, 99);
  s.max = values.back();
  return s;
}

std::optional<double> tpot_s(const RequestResult& r) {
  if (!r.ok || r.output_tokens < 2) return std::nullopt;
  return (r.latency_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

std::string Slo::to_string() const {
  std::string s;
  auto add = [&](const char* k, const std::optional<double>& v) {
    if (!v) return;
    if (!s.empty()) s += ',';
    char b[64];
    std::snprintf(b, sizeof b, "%s=%g", k, *v);
    s += b;
  };
  add("ttft", ttft_ms);
  add("tpot", tpot_ms);
  add("e2el", e2el_ms);
  return s;
}

Result<Slo> parse_slo(std::string_view spec) {
  Slo slo;
  size_t pos = 0;
  while (pos <= spec.size() && !spec.empty()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    const std::string item(spec.substr(pos, end - pos));
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return invalid_argument("--slo: '" + item + "' is not KEY=MILLISECONDS (keys: ttft, tpot, e2el)");
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* e = nullptr;
    const double ms = std::strtod(val.c_str(), &e);
    if (val.empty() || *e || !(ms > 0) || !std::isfinite(ms))
      return invalid_argument("--slo: '" + item + "' needs a positive number of milliseconds");
    if (key == "ttft") slo.ttft_ms = ms;
    else if (key == "tpot") slo.tpot_ms = ms;
    else if (key == "e2el") slo.e2el_ms = ms;
    else return invalid_argument("--slo: unknown key '" + key + "' (keys: ttft, tpot, e2el)");
    pos = end + 1;
    if (end == spec.size()) break;
  }
  return slo;
}

bool meets_slo(const RequestResult& r, const Slo& slo) {
  if (!r.ok) return false;
  if (slo.ttft_ms && r.ttft_s * 1e3 > *slo.ttft_ms) return false;
  if (slo.tpot_ms) {
    if (auto t = tpot_s(r); t && *t * 1e3 > *slo.tpot_ms) return false;
  }
  if (slo.e2el_ms && r.latency_s * 1e3 > *slo.e2el_ms) return false;
  return true;
}

BenchMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s, const Slo& slo) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++m.failed;
      ++m.failures[r.error_kind.empty() ? "unknown" : r.error_kind];
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.latency_s * 1e3);
    if (auto t = tpot_s(r)) tpot.push_back(*t * 1e3);
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    if (meets_slo(r, slo)) ++m.n_good;
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.input_throughput = static_cast<double>(m.total_input_tokens) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput =
        static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
    m.goodput = static_cast<double>(m.n_good) / duration_s;
  }
  m.ttft_ms = summarize(std::move(ttft));
  m.tpot_ms = summarize(std::move(tpot));
  m.itl_ms = summarize(std::move(itl));
  m.e2el_ms = summarize(std::move(e2el));
  return m;
}

}  // namespace pagellm::bench
