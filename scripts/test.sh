#!/usr/bin/env bash
# Runs every test that needs no GPU, as CI does:
#   1. the default (CPU) preset: build everything, run all CTest tests (unit, golden model tests
#      against transformers, server tests against a real `pagellm serve` on loopback);
#   2. the unit tests again under AddressSanitizer + UBSan (asan preset);
#   3. when nvcc is present, a compile of the CUDA backend and its op tests (they run on a GPU
#      through scripts/gpu-check.sh).
#   scripts/test.sh           all three
#   scripts/test.sh --quick   the CPU preset only
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc)
# Everything the tests need (idempotent; quick when already installed).
scripts/setup.sh

echo "== cpu preset: build"
cmake --preset cpu -G Ninja >/dev/null
cmake --build build/cpu -j "$jobs"
echo "== cpu preset: tests"
ctest --test-dir build/cpu --output-on-failure -j "$jobs"

[ "$quick" = 1 ] && exit 0

echo "== asan preset: unit tests under AddressSanitizer + UBSan"
cmake --preset asan -G Ninja >/dev/null
unit_targets=()
for d in tests/unit/*/; do unit_targets+=("test_$(basename "$d")"); done
cmake --build build/asan -j "$jobs" --target "${unit_targets[@]}"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build/asan --output-on-failure -j "$jobs" -L unit

if command -v nvcc >/dev/null; then
  echo "== cuda preset: compile the CUDA backend and its op tests (sm_90a)"
  cmake --preset cuda -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGELLM_BENCH=OFF >/dev/null
  cmake --build build/cuda -j "$jobs" --target pagellm_backend_cuda test_ops
fi
echo "== all tests passed"
