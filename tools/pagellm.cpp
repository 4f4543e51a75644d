// pagellm: one binary — serve | generate | chat | bench | tokenize | detokenize | template |
// inspect. Each subcommand lives in tools/cmd_<name>.cpp and registers itself in the table below.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace pagellm::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::printf("usage: pagellm <command> [options]\n\ncommands:\n");
    for (const Command& c : commands()) std::printf("  %-12s %s\n", c.name, c.summary);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : commands()) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "pagellm: unknown command '%s' (try --help)\n", argv[1]);
  return 2;
}
