#!/usr/bin/env bash
# Builds the CUDA binaries scripts/gpu-check.sh runs (test_ops, test_model, pagellm) on this
# machine, for sm_90a, and packs them into .carry/prebuilt with the hash of the sources they came
# from (scripts/source-hash.sh). A GPU machine then runs them instead of building them:
#
#   scripts/gpu-prebuild.sh                                           # here
#   PAGELLM_CHECK_PREBUILT=.carry/prebuilt scripts/gpu-check.sh       # there, carrying
#                                                                     # .carry/prebuilt alone
#
# which saves each GPU run its build (~80 s of ~16 cores). gpu-check refuses binaries whose
# hash is not that of the sources beside them. Environment: PAGELLM_BUILD_DIR (default
# build/cuda-dev; configured with the cuda preset when it has no cache yet), PAGELLM_CUDA_ARCH
# (default 90a), JOBS (default: the cores), PAGELLM_PREBUILD_BENCHES (kernel micro-benchmarks to
# build too, e.g. "cuda_gemv_bench", into .carry/prebuilt/bench: gpu-check runs them with
# PAGELLM_CHECK_KERNEL_BENCH=1 PAGELLM_KERNEL_BENCHES=<the same names>).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${PAGELLM_BUILD_DIR:-build/cuda-dev}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake --preset cuda -B "$build" -DCMAKE_CUDA_ARCHITECTURES="${PAGELLM_CUDA_ARCH:-90a}"
fi
hash=$(scripts/source-hash.sh)
benches=(${PAGELLM_PREBUILD_BENCHES:-})
if [ ${#benches[@]} -gt 0 ] && ! grep -q '^PAGELLM_BENCH:BOOL=ON' "$build/CMakeCache.txt"; then
  cmake -B "$build" -DPAGELLM_BENCH=ON >/dev/null
fi
cmake --build "$build" --target test_ops test_model pagellm ${benches[@]+"${benches[@]}"} -j "${JOBS:-$(nproc)}"
# The sources must not have changed during the build, or the hash would name other binaries.
[ "$(scripts/source-hash.sh)" = "$hash" ] || { echo "gpu-prebuild: sources changed while building; run it again" >&2; exit 1; }
rm -rf .carry/prebuilt
mkdir -p .carry/prebuilt/tests .carry/prebuilt/tools
cp "$build/tests/test_ops" "$build/tests/test_model" .carry/prebuilt/tests/
cp "$build/tools/pagellm" .carry/prebuilt/tools/
if [ ${#benches[@]} -gt 0 ]; then
  mkdir -p .carry/prebuilt/bench
  for b in "${benches[@]}"; do cp "$build/bench/$b" .carry/prebuilt/bench/; done
fi
# The shared libraries they link here that a GPU machine may lack (built there, they link the
# carried static archives instead; scripts/carry-deps.sh; Google Benchmark for the benches):
# beside them, in the library path gpu-check sets.
mkdir -p .carry/prebuilt/lib
ldd .carry/prebuilt/tests/* .carry/prebuilt/tools/pagellm ${benches[@]+"${benches[@]/#/.carry/prebuilt/bench/}"} |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -E '/lib(utf8proc|pcre2-8|xxhash|sentencepiece|benchmark)\.so' | sort -u |
  xargs -r cp -L -t .carry/prebuilt/lib/
echo "$hash" >.carry/prebuilt/source-hash
du -sh .carry/prebuilt
