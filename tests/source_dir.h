// The repository root whose files the tests read (tests/data, bench/prices.toml):
// $PAGELLM_SOURCE_DIR when set, so that binaries built from one copy of the repository can run
// against another (scripts/gpu-check.sh's PAGELLM_CHECK_PREBUILT: built here, run on a GPU
// machine), else the root they were built from.
#pragma once

#include <cstdlib>
#include <string>

inline std::string test_source_dir() {
  const char* v = std::getenv("PAGELLM_SOURCE_DIR");
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(PAGELLM_SOURCE_DIR);
}
