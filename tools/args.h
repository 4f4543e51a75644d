// Command-line options for the pagellm subcommands. Each command declares its options once, in a
// table with their meaning, unit and default; `--help` prints that table, and the getters return
// the declared default, so help and behaviour cannot drift apart.
//
// Where a value comes from, the first that has it wins:
//   1. the command line:            --kv-cache-memory 8GiB   (or --kv-cache-memory=8GiB)
//   2. the environment:             PAGELLM_KV_CACHE_MEMORY=8GiB, then the option's aliases
//                                   (e.g. OTEL_SERVICE_NAME)
//   3. the --config file:           kv-cache-memory: 8GiB    (YAML or JSON, a map of option names)
//   4. the declared default.
// Unknown options and file keys, missing values and malformed numbers are errors that name the
// option (and the closest known one).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm::cli {

struct Option {
  std::string name;     // without the leading "--"
  std::string metavar;  // what the value is, e.g. "N", "BYTES", "SECONDS"; "" = a switch
  std::string help;     // meaning and unit
  // Parsed like a given value when the option is not set; printed as the default.
  std::optional<std::string> default_value = std::nullopt;
  // Printed as the default where there is no fixed one (e.g. "the embedded default model").
  std::string default_note = "";
  // Environment variables read after PAGELLM_<NAME>, for standard names (OTEL_SERVICE_NAME).
  std::vector<std::string> env_aliases = {};
};

struct OptionGroup {
  std::string title;  // "Model", "KV cache", "Scheduler", "Server", "Observability", ...
  std::vector<Option> options;
};

class Args {
 public:
  // `command`: "serve", "bench latency", ...; `about`: the paragraph --help prints under the
  // usage line. Every command also accepts --config FILE and --help.
  Args(std::string command, std::string about, std::vector<OptionGroup> groups);

  // Parses argv[1..argc); non-option arguments are collected as positionals. After an ok parse,
  // help_requested() says whether the caller should print help() and exit 0.
  Status parse(int argc, char** argv);
  bool help_requested() const { return help_requested_; }
  std::string help() const;

  // Whether the option was set (command line, environment or file), not defaulted.
  bool has(const std::string& name) const;
  // The set value, else the declared default, else nullopt.
  std::optional<std::string> get(const std::string& name) const;
  // get(name), or "" when neither set nor defaulted.
  std::string str(const std::string& name) const;
  bool flag(const std::string& name) const;
  // Numbers: the set value or the declared default; an option with neither is an error naming it.
  Result<int64_t> get_int(const std::string& name) const;
  Result<double> get_double(const std::string& name) const;
  // A byte count: a plain number, or one with a unit, SI (kB MB GB TB: powers of 1000) or binary
  // (KiB MiB GiB TiB: powers of 1024); "B" and case are optional ("8GiB", "8gib", "512M").
  Result<int64_t> get_bytes(const std::string& name) const;
  // Comma-separated integers, e.g. "5,17,42"; empty when unset.
  Result<std::vector<int32_t>> get_int_list(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  const std::string& command() const { return command_; }

  // "PAGELLM_KV_CACHE_MEMORY" for "kv-cache-memory".
  static std::string env_name(const std::string& option);

 private:
  const Option* find(const std::string& name) const;
  // The known option closest to `name` (edit distance), for "did you mean" hints; "" if none is
  // near.
  std::string closest(const std::string& name) const;
  Status load_config_file(const std::string& path);
  Status set_value(const Option& o, const std::string& value, const std::string& source);
  Status check_value(const Option& o, const std::string& value) const;
  Result<int64_t> parse_int(const std::string& name, const std::string& v) const;

  std::string command_;
  std::string about_;
  std::vector<OptionGroup> groups_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positionals_;
  bool help_requested_ = false;
};

// Parses `a`; on --help prints the help to stdout and returns 0, on an error prints
// "pagellm <command>: <message>" to stderr and returns 1; nullopt: go on.
//   if (auto rc = parse_command_line(a, argc, argv)) return *rc;
std::optional<int> parse_command_line(Args& a, int argc, char** argv);

// "8GiB" -> 8589934592 (see Args::get_bytes); an error names `what`.
Result<int64_t> parse_bytes(const std::string& what, const std::string& text);

}  // namespace pagellm::cli
