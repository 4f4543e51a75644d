#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

namespace pagellm {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "-" where a figure does not apply: no flops (data movement), or an unknown ceiling.
std::string tflops_cell(double flops, double tflop_per_s) {
  return flops > 0 ? fmt("%.2f", tflop_per_s) : "-";
}
std::string fraction_cell(double achieved, double ceiling, bool applies) {
  if (!applies || ceiling <= 0) return "-";
  const double pct = 100.0 * achieved / ceiling;
  return fmt(pct < 9.95 ? "%.1f%%" : "%.0f%%", pct);  // small fractions keep a digit
}
nlohmann::json fraction_json(double achieved, double ceiling, bool applies) {
  return applies && ceiling > 0 ? nlohmann::json(achieved / ceiling) : nlohmann::json(nullptr);
}

// "key=value" fields of a shape key, in order; other words (dtype names, "+bias") have no key.
std::vector<std::pair<std::string, std::string>> shape_fields(const std::string& shape) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < shape.size()) {
    size_t j = shape.find(' ', i);
    if (j == std::string::npos) j = shape.size();
    const std::string word = shape.substr(i, j - i);
    const size_t eq = word.find('=');
    if (!word.empty()) {
      if (eq == std::string::npos)
        out.emplace_back("", word);
      else
        out.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string step_independent_shape(const OpSample& s) {
  const auto fields = shape_fields(s.shape);
  // Per-step sizes: tokens (n), sequences, queries, context, rows gathered, sampled rows, bytes.
  auto per_step = [&](const std::string& k) {
    return k == "n" || k == "seqs" || k == "q" || k == "kv" || k == "bytes" || k == "rows" ||
           (k == "m" && s.op == "gather_rows");
  };
  std::string out;
  if (s.op == "attention" || s.op == "attention_project") {
    std::string seqs, q;
    for (const auto& [k, v] : fields) {
      if (k == "seqs") seqs = v;
      if (k == "q") q = v;
    }
    out = seqs == q ? "decode" : "prefill";
  }
  for (const auto& [k, v] : fields) {
    if (per_step(k)) continue;
    if (!out.empty()) out += ' ';
    out += k.empty() ? v : k + "=" + v;
  }
  return out;
}

OpProfileTable summarize_ops(std::string step, std::span<const OpSample> samples, double wall_ms,
                             const OpCeilings& ceilings) {
  OpProfileTable t;
  t.step = std::move(step);
  t.wall_ms = wall_ms;
  t.ceilings = ceilings;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const OpSample& s : samples) {
    auto [it, fresh] = index.try_emplace({s.op, s.shape}, t.rows.size());
    if (fresh) t.rows.push_back(OpProfileRow{s.op, s.shape});
    OpProfileRow& r = t.rows[it->second];
    ++r.calls;
    r.ms += s.ms;
    r.bytes += s.bytes;
    r.flops += s.flops;
    ++t.calls;
    t.sum_ms += s.ms;
    t.bytes += s.bytes;
    t.flops += s.flops;
  }
  for (OpProfileRow& r : t.rows) r.share = t.sum_ms > 0 ? r.ms / t.sum_ms : 0;
  std::stable_sort(t.rows.begin(), t.rows.end(),
                   [](const OpProfileRow& a, const OpProfileRow& b) { return a.ms > b.ms; });
  return t;
}

std::string format_op_table(const OpProfileTable& t) {
  size_t w = 5;  // "total"
  for (const OpProfileRow& r : t.rows) w = std::max(w, r.op.size() + 1 + r.shape.size());
  const OpCeilings& c = t.ceilings;
  std::string out = t.step + ": " + std::to_string(t.calls) + " op calls\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-*s %6s %10s %6s %9s %5s %8s %6s\n", static_cast<int>(w), "op",
                "calls", "total ms", "share", "GB/s", "%bw", "TFLOP/s", "%peak");
  out += line;
  auto row = [&](const std::string& name, int64_t calls, double ms, double share, double bytes,
                 double flops) {
    const double s = ms * 1e-3;
    const double gbs = s > 0 ? bytes / s / 1e9 : 0, tfs = s > 0 ? flops / s / 1e12 : 0;
    std::snprintf(line, sizeof line, "  %-*s %6lld %10.4f %5.1f%% %9.1f %5s %8s %6s\n", static_cast<int>(w),
                  name.c_str(), static_cast<long long>(calls), ms, 100.0 * share, gbs,
                  fraction_cell(gbs, c.bandwidth_gbs, bytes > 0).c_str(), tflops_cell(flops, tfs).c_str(),
                  fraction_cell(tfs, c.tflops, flops > 0).c_str());
    out += line;
  };
  for (const OpProfileRow& r : t.rows) row(r.op + " " + r.shape, r.calls, r.ms, r.share, r.bytes, r.flops);
  row("total", t.calls, t.sum_ms, t.sum_ms > 0 ? 1.0 : 0.0, t.bytes, t.flops);
  out += "  ceilings: " + (c.bandwidth_gbs > 0 ? fmt("%.1f GB/s", c.bandwidth_gbs) : std::string("bandwidth unknown")) +
         ", " + (c.tflops > 0 ? fmt("%.1f TFLOP/s", c.tflops) : std::string("compute peak unknown")) + "\n";
  if (t.wall_ms > 0) {
    const double gap = t.wall_ms - t.sum_ms;
    std::snprintf(line, sizeof line,
                  "  ops sum %.4f ms vs %.4f ms wall for %s: %.4f ms (%.1f%%) "
                  "launch and host overhead\n",
                  t.sum_ms, t.wall_ms, t.wall_of.c_str(), gap, 100.0 * gap / t.wall_ms);
    out += line;
  } else {
    std::snprintf(line, sizeof line, "  ops sum %.4f ms (no unprofiled wall time measured)\n", t.sum_ms);
    out += line;
  }
  return out;
}

nlohmann::json op_table_json(const OpProfileTable& t) {
  const OpCeilings& c = t.ceilings;
  nlohmann::json rows = nlohmann::json::array();
  for (const OpProfileRow& r : t.rows) {
    rows.push_back({{"op", r.op},
                    {"shape", r.shape},
                    {"calls", r.calls},
                    {"ms", r.ms},
                    {"share", r.share},
                    {"bytes", r.bytes},
                    {"flops", r.flops},
                    {"gb_per_s", r.gb_per_s()},
                    {"tflop_per_s", r.tflop_per_s()},
                    {"bandwidth_fraction", fraction_json(r.gb_per_s(), c.bandwidth_gbs, r.bytes > 0)},
                    {"compute_fraction", fraction_json(r.tflop_per_s(), c.tflops, r.flops > 0)}});
  }
  nlohmann::json j = {
      {"step", t.step},
      {"calls", t.calls},
      {"sum_ms", t.sum_ms},
      {"bytes", t.bytes},
      {"flops", t.flops},
      {"wall_ms", t.wall_ms > 0 ? nlohmann::json(t.wall_ms) : nlohmann::json(nullptr)},
      {"overhead_ms", t.wall_ms > 0 ? nlohmann::json(t.wall_ms - t.sum_ms) : nlohmann::json(nullptr)},
      {"ceilings",
       {{"bandwidth_gb_per_s", c.bandwidth_gbs > 0 ? nlohmann::json(c.bandwidth_gbs) : nlohmann::json(nullptr)},
        {"tflop_per_s", c.tflops > 0 ? nlohmann::json(c.tflops) : nlohmann::json(nullptr)}}},
      {"rows", std::move(rows)}};
  return j;
}

}  // namespace pagellm
