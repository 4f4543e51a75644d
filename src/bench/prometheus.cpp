#include "bench/prometheus.h"

#include <cmath>
#include <cstdlib>

namespace pagellm::bench {

Result<PromSamples> parse_prometheus(std::string_view text) {
  PromSamples out;
  size_t pos = 0;
  for (int line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line.empty() || line[0] == '#') continue;
    // name[{labels}] value [timestamp]; label values may hold spaces and braces inside quotes.
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      bool in_quotes = false;
      for (++i; i < line.size(); ++i) {
        if (in_quotes && line[i] == '\\') { ++i; continue; }
        if (line[i] == '"') in_quotes = !in_quotes;
        else if (line[i] == '}' && !in_quotes) break;
      }
      if (i >= line.size()) return data_loss("/metrics line " + std::to_string(line_no) + ": unterminated labels");
      ++i;
    }
    while (i < line.size() && line[i] == ' ') ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    const std::string value(line.substr(i, j - i));
    if (name.empty() || value.empty())
      return data_loss("/metrics line " + std::to_string(line_no) + ": expected 'name value'");
    double v = 0;
    if (value == "+Inf") v = INFINITY;
    else if (value == "-Inf") v = -INFINITY;
    else if (value == "NaN") v = NAN;
    else {
      char* e = nullptr;
      v = std::strtod(value.c_str(), &e);
      if (*e) return data_loss("/metrics line " + std::to_string(line_no) + ": bad value '" + value + "'");
    }
    out[name] += v;
  }
  return out;
}

double counter_delta(const PromSamples& before, const PromSamples& after, const std::string& name) {
  auto get = [&](const PromSamples& s) {
    auto it = s.find(name);
    return it == s.end() ? 0.0 : it->second;
  };
  return get(after) - get(before);
}

HistogramDelta histogram_delta(const PromSamples& before, const PromSamples& after, const std::string& name) {
  HistogramDelta d;
  d.count = counter_delta(before, after, name + "_count");
  d.sum = counter_delta(before, after, name + "_sum");
  return d;
}

}  // namespace pagellm::bench
