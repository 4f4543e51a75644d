// The subcommand table of the pagellm binary. Each tools/cmd_<name>.cpp defines one
// `int run_<name>(int argc, char** argv)` (argv[0] is the command name).
#pragma once

#include <vector>

namespace pagellm::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

const std::vector<Command>& commands();

}  // namespace pagellm::cli
