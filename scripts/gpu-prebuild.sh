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
# PAGELLM_CHECK_KERNEL_BENCH=1 PAGELLM_KERNEL_BENCHES=<the same names>), PAGELLM_PREBUILD_REVS
# (other revisions whose pagellm to build too, each in build/rev/<sha> from `git archive`, into
# .carry/prebuilt/rev/<sha, 7 digits>: gpu-check's A/B lists then alternate them with the
# sources' binary, a setting PAGELLM_REV=<sha>, with no build on the GPU machine),
# PAGELLM_PREBUILD_TESTS=0 (leave out test_ops and test_model, ~26 MB, for a benchmarks-only run,
# PAGELLM_CHECK_TESTS=0: with a revision's pagellm beside it, the whole carry must stay under the
# 64 MiB a copy takes).
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
tests=(test_ops test_model)
[ "${PAGELLM_PREBUILD_TESTS:-1}" = 0 ] && tests=()
cmake --build "$build" --target ${tests[@]+"${tests[@]}"} pagellm ${benches[@]+"${benches[@]}"} -j "${JOBS:-$(nproc)}"
# The sources must not have changed during the build, or the hash would name other binaries.
[ "$(scripts/source-hash.sh)" = "$hash" ] || { echo "gpu-prebuild: sources changed while building; run it again" >&2; exit 1; }
rm -rf .carry/prebuilt
mkdir -p .carry/prebuilt/tests .carry/prebuilt/tools
for t in ${tests[@]+"${tests[@]}"}; do cp "$build/tests/$t" .carry/prebuilt/tests/; done
cp "$build/tools/pagellm" .carry/prebuilt/tools/
# Other revisions' pagellm, each built from its own tree (an incremental build when it was built
# before), for A/B runs against the sources' binary on one machine.
for rev in ${PAGELLM_PREBUILD_REVS:-}; do
  sha=$(git rev-parse --short=7 "$rev^{commit}")
  rdir=build/rev/$sha
  if [ ! -f "$rdir/src/CMakePresets.json" ]; then
    rm -rf "$rdir/src"
    mkdir -p "$rdir/src"
    git archive "$sha" | tar -x -C "$rdir/src"
  fi
  if [ ! -f "$rdir/build/CMakeCache.txt" ]; then
    (cd "$rdir/src" && cmake --preset cuda -B ../build -DCMAKE_CUDA_ARCHITECTURES="${PAGELLM_CUDA_ARCH:-90a}")
  fi
  cmake --build "$rdir/build" --target pagellm -j "${JOBS:-$(nproc)}"
  mkdir -p ".carry/prebuilt/rev/$sha"
  cp "$rdir/build/tools/pagellm" ".carry/prebuilt/rev/$sha/"
done
if [ ${#benches[@]} -gt 0 ]; then
  mkdir -p .carry/prebuilt/bench
  for b in "${benches[@]}"; do cp "$build/bench/$b" .carry/prebuilt/bench/; done
fi
# The shared libraries they link here that a GPU machine may lack (built there, they link the
# carried static archives instead; scripts/carry-deps.sh; Google Benchmark for the benches):
# beside them, in the library path gpu-check sets.
mkdir -p .carry/prebuilt/lib
shopt -s nullglob
binaries=(.carry/prebuilt/tools/pagellm .carry/prebuilt/rev/*/pagellm .carry/prebuilt/tests/*
          .carry/prebuilt/bench/*)
ldd "${binaries[@]}" |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -E '/lib(utf8proc|pcre2-8|xxhash|sentencepiece|benchmark|yaml-cpp)\.so' | sort -u |
  xargs -r cp -L -t .carry/prebuilt/lib/
echo "$hash" >.carry/prebuilt/source-hash
du -sh .carry/prebuilt
