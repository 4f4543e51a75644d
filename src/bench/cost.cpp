#include "bench/cost.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace pagellm::bench {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool bare_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

// Reads a double-quoted string starting at s[0] == '"'; returns the bytes consumed or 0 on error.
size_t read_quoted(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i] == '"') return i + 1;
    if (s[i] == '\\') {
      if (++i >= s.size()) return 0;
      switch (s[i]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        default: return 0;
      }
      continue;
    }
    out += s[i];
  }
  return 0;
}

std::string normalize(std::string_view s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<std::map<std::string, TomlValue>> parse_toml_subset(std::string_view text, const std::string& name) {
  std::map<std::string, TomlValue> out;
  std::string section;
  size_t pos = 0;
  for (int line_no = 1; pos <= text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    const std::string where = name + ":" + std::to_string(line_no);
    if (line.empty() || line[0] == '#') {
      if (end == text.size()) break;
      continue;
    }
    if (line[0] == '[') {
      const size_t close = line.find(']');
      if (close == std::string_view::npos) return data_loss(where + ": unterminated [section]");
      const std::string_view rest = trim(line.substr(close + 1));
      if (!rest.empty() && rest[0] != '#') return data_loss(where + ": text after [section]");
      section = std::string(trim(line.substr(1, close - 1)));
      if (section.empty() || !std::all_of(section.begin(), section.end(), [](char c) { return bare_key_char(c) || c == '.'; }))
        return data_loss(where + ": bad section name");
      if (end == text.size()) break;
      continue;
    }
    std::string key;
    size_t i = 0;
    if (line[0] == '"') {
      i = read_quoted(line, key);
      if (i == 0 || key.empty()) return data_loss(where + ": bad quoted key");
    } else {
      while (i < line.size() && bare_key_char(line[i])) ++i;
      key = std::string(line.substr(0, i));
      if (key.empty()) return data_loss(where + ": expected key = value");
    }
    std::string_view rest = trim(line.substr(i));
    if (rest.empty() || rest[0] != '=') return data_loss(where + ": expected '=' after key '" + key + "'");
    rest = trim(rest.substr(1));
    TomlValue value;
    std::string_view tail;
    if (!rest.empty() && rest[0] == '"') {
      std::string s;
      const size_t n = read_quoted(rest, s);
      if (n == 0) return data_loss(where + ": bad string for '" + key + "'");
      value = s;
      tail = rest.substr(n);
    } else {
      size_t n = 0;
      while (n < rest.size() && rest[n] != '#' && rest[n] != ' ' && rest[n] != '\t') ++n;
      const std::string tok(rest.substr(0, n));
      tail = rest.substr(n);
      if (tok == "true" || tok == "false") {
        value = tok == "true";
      } else {
        std::string digits;
        for (char c : tok)
          if (c != '_') digits += c;  // TOML allows 1_000
        char* e = nullptr;
        const double d = std::strtod(digits.c_str(), &e);
        if (digits.empty() || *e || !std::isfinite(d))
          return data_loss(where + ": value of '" + key + "' is not a number, string or boolean");
        value = d;
      }
    }
    tail = trim(tail);
    if (!tail.empty() && tail[0] != '#') return data_loss(where + ": text after the value of '" + key + "'");
    const std::string full = section.empty() ? key : section + "." + key;
    if (out.count(full)) return data_loss(where + ": duplicate key '" + full + "'");
    out[full] = std::move(value);
    if (end == text.size()) break;
  }
  return out;
}

Result<PriceTable> PriceTable::parse(std::string_view text, const std::string& name) {
  auto kv = parse_toml_subset(text, name);
  if (!kv.ok()) return kv.status();
  PriceTable t;
  const std::string prefix = "usd_per_hour.";
  for (const auto& [k, v] : *kv) {
    if (k.rfind(prefix, 0) != 0) continue;
    const double* d = std::get_if<double>(&v);
    if (!d || !(*d > 0)) return data_loss(name + ": [usd_per_hour] '" + k.substr(prefix.size()) + "' must be a positive number");
    t.prices_[k.substr(prefix.size())] = *d;
  }
  if (t.prices_.empty()) return data_loss(name + ": no [usd_per_hour] entries");
  return t;
}

Result<PriceTable> PriceTable::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open the price table");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

Result<double> PriceTable::usd_per_hour(const std::string& gpu) const {
  const std::string want = normalize(gpu);
  for (const auto& [k, v] : prices_)
    if (normalize(k) == want) return v;
  std::string known;
  for (const auto& [k, v] : prices_) known += (known.empty() ? "" : ", ") + k;
  return not_found("no price for '" + gpu + "' (known: " + known + ")");
}

Result<CostRow> compute_cost(const CostInput& in, const PriceTable& prices) {
  if (in.n_gpus < 1) return invalid_argument("--gpus must be >= 1");
  if (!(in.utilization > 0 && in.utilization <= 1)) return invalid_argument("--utilization must be in (0, 1]");
  if (!(in.output_tokens_per_s > 0)) return invalid_argument(in.label + ": output throughput is not positive");
  auto price = prices.usd_per_hour(in.gpu);
  if (!price.ok()) return price.status();
  CostRow r;
  r.in = in;
  r.usd_per_hour = *price * static_cast<double>(in.n_gpus);
  // Paid for every hour, serving at the measured rate for `utilization` of them.
  const double out_per_hour = in.output_tokens_per_s * 3600.0 * in.utilization;
  const double total_per_hour = in.total_tokens_per_s * 3600.0 * in.utilization;
  r.output_tok_s_per_usd_hour = in.output_tokens_per_s * in.utilization / r.usd_per_hour;
  r.usd_per_million_output = r.usd_per_hour / out_per_hour * 1e6;
  r.usd_per_million_total = total_per_hour > 0 ? r.usd_per_hour / total_per_hour * 1e6 : 0;
  return r;
}

std::string cost_markdown(std::vector<CostRow> rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const CostRow& a, const CostRow& b) { return a.usd_per_million_output < b.usd_per_million_output; });
  std::string s =
      "| rank | run | gpu | precision | units | util | output tok/s | $/hour | output tok/s per $/h | $ / 1M output | $ / 1M total |\n"
      "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  char b[512];
  for (size_t i = 0; i < rows.size(); ++i) {
    const CostRow& r = rows[i];
    std::snprintf(b, sizeof b, "| %zu | %s | %s | %s | %lld | %.2f | %.1f | %.2f | %.1f | %.4f | %.4f |\n", i + 1,
                  r.in.label.c_str(), r.in.gpu.c_str(), r.in.precision.empty() ? "-" : r.in.precision.c_str(),
                  static_cast<long long>(r.in.n_gpus), r.in.utilization, r.in.output_tokens_per_s,
                  r.usd_per_hour, r.output_tok_s_per_usd_hour, r.usd_per_million_output, r.usd_per_million_total);
    s += b;
  }
  return s;
}

}  // namespace pagellm::bench
