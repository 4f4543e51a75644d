// pagellm: one binary — serve | generate | chat | bench | tokenize | detokenize | template |
// inspect | quantize, and --version. Each subcommand lives in tools/cmd_<name>.cpp and is listed
// in tools/commands.cpp.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/version.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace pagellm::cli;
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    std::printf("pagellm %s (commit %s)\n", pagellm::version(), pagellm::build_commit());
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::printf("usage: pagellm <command> [options]\n       pagellm --version\n\ncommands:\n");
    for (const Command& c : commands()) std::printf("  %-12s %s\n", c.name, c.summary);
    std::printf(
        "\npagellm <command> --help lists a command's options, their defaults and their\n"
        "environment variables.\n");
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : commands()) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "pagellm: unknown command '%s' (try --help)\n", argv[1]);
  return 2;
}
