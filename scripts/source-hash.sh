#!/usr/bin/env bash
# Prints one hash of the files the project's binaries are compiled from (sources, headers, CMake
# files), the same for any copy of the repository with the same contents: scripts/gpu-check.sh
# compares it with the hash scripts/gpu-prebuild.sh stored beside its prebuilt binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
find src tools tests bench cmake CMakeLists.txt CMakePresets.json -type f \
  \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' \
     -o -name '*.cuh' -o -name '*.inc' -o -name 'CMakeLists.txt' -o -name '*.cmake' \
     -o -name 'CMakePresets.json' \) -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
