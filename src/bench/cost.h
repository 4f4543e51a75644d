// What a measured throughput costs: a price table (bench/prices.toml, a small TOML subset) and
// the arithmetic from tokens/s to $ per million tokens.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"

namespace pagellm::bench {

// The TOML subset the price table needs: `[section]` headers, `key = value` with bare
// (A-Za-z0-9_-) or double-quoted keys, values that are numbers, double-quoted strings or
// booleans, and `#` comments. Keys come back as "section.key". Anything else is an error naming
// the line.
using TomlValue = std::variant<double, std::string, bool>;
Result<std::map<std::string, TomlValue>> parse_toml_subset(std::string_view text, const std::string& name);

// GPU (or "CPU core") -> US dollars per hour, from the [usd_per_hour] section.
class PriceTable {
 public:
  static Result<PriceTable> parse(std::string_view text, const std::string& name);
  static Result<PriceTable> load(const std::string& path);
  // Case-, space- and dash-insensitive lookup ("h100-sxm" finds "H100 SXM"); an unknown name is
  // an error listing the known ones.
  Result<double> usd_per_hour(const std::string& gpu) const;
  const std::map<std::string, double>& entries() const { return prices_; }

 private:
  std::map<std::string, double> prices_;
};

struct CostInput {
  std::string label;        // report file or tag
  std::string gpu;          // price-table key
  std::string precision;    // e.g. bf16, int4 (only for the table)
  int64_t n_gpus = 1;       // paid units: GPUs, or CPU cores for "CPU core"
  double utilization = 1.0; // share of paid hours spent serving at the measured throughput
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;
};

struct CostRow {
  CostInput in;
  double usd_per_hour = 0;              // n_gpus x price
  double output_tok_s_per_usd_hour = 0; // output tok/s per $/hour paid, after utilization
  double usd_per_million_output = 0;    // $ per 1e6 output tokens
  double usd_per_million_total = 0;     // $ per 1e6 prompt + output tokens
};

Result<CostRow> compute_cost(const CostInput& in, const PriceTable& prices);
// A Markdown table, cheapest ($ per million output tokens) first.
std::string cost_markdown(std::vector<CostRow> rows);

}  // namespace pagellm::bench
