// Command-line options for the pagellm subcommands. Every option `--some-flag` can also be set by
// the environment variable PAGELLM_SOME_FLAG; the command line wins. Unknown options, missing
// values and malformed numbers are errors naming the option.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm::cli {

class Args {
 public:
  // `spec`: the options this command accepts; a trailing '!' marks a boolean switch
  // (e.g. {"model", "max-tokens", "json!"}).
  Args(std::string command, std::vector<std::string> spec);

  // Parses argv[1..argc); non-option arguments are collected as positionals.
  Status parse(int argc, char** argv);

  bool has(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  bool flag(const std::string& name) const;
  Result<int64_t> get_int(const std::string& name, int64_t fallback) const;
  Result<double> get_double(const std::string& name, double fallback) const;
  // Comma-separated integers, e.g. "5,17,42".
  Result<std::vector<int32_t>> get_int_list(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  std::string usage() const;

 private:
  static std::string env_name(const std::string& option);

  std::string command_;
  std::map<std::string, bool> spec_;  // name -> is boolean switch
  std::map<std::string, std::string> values_;
  std::vector<std::string> positionals_;
};

}  // namespace pagellm::cli
