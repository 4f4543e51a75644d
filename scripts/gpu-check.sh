#!/usr/bin/env bash
# One command for a GPU machine: configure and build the cuda preset, run the CUDA op tests
# (every op against the CPU reference), run compute-sanitizer memcheck on a reduced op filter
# and racecheck on the attention kernels and the GEMV,
# run the CPU golden model tests, and print a summary table. Works offline from a fresh copy of
# the repository: libraries the system lacks come from .carry/pkg/deps.tar.gz, made by
# scripts/carry-deps.sh on a Debian 12 machine.
#
#   scripts/gpu-check.sh
# Environment: PAGELLM_CUDA_ARCH (default 90a), JOBS (default 16), PAGELLM_OPS_SEED (op test seed),
# PAGELLM_CHECK_BUDGET (seconds, default 570) bounds the whole run: each step gets a timeout from
# what is left, so the summary always prints inside a 10-minute remote command limit;
# PAGELLM_CHECK_ALL=1 also builds every target of the preset; PAGELLM_CHECK_NSYS=1 adds an Nsight
# Systems kernel summary of batch-1 decode (graphs traced per node); PAGELLM_CHECK_BATCHING=1 runs
# bench serve under the three batching policies; PAGELLM_CHECK_MOE=1 adds the Mixtral-8x7B- and
# DeepSeek-V2-Lite-shape benchmarks; PAGELLM_CHECK_STRUCTURED=1 the structured-output ones
# (Llama-3-8B shape, a JSON schema against none); PAGELLM_CHECK_SPEC=1 the speculative-decoding
# ones; PAGELLM_CHECK_OPS_EXTRA=0 skips test_ops' variant runs and the sanitizers (a targeted
# re-check); PAGELLM_CHECK_TESTS=0 skips the
# tests (benchmarks only); PAGELLM_BUILD_DIR overrides the
# preset's build folder; PAGELLM_CHECK_CONFIGURE_ONLY=1 stops after configuring (to test the
# dependency setup on a machine without a GPU); PAGELLM_OPS_FILTER / PAGELLM_MODEL_FILTER narrow
# test_ops / test_model to a gtest filter (a re-run of what failed; memcheck keeps its own);
# PAGELLM_CHECK_ARCHIVE=FILE.tar.gz packs every log and bench report of the run into one file;
# PAGELLM_CHECK_PROFILE_OFFLINE=1 adds per-op profiles of offline runs (bench throughput --profile);
# PAGELLM_OFFLINE_SEQS / PAGELLM_OFFLINE_TOKENS set the Llama offline runs' max-num-seqs (512) and
# max-num-batched-tokens (16384); PAGELLM_CHECK_KERNEL_BENCH=1 builds and runs the attention kernel
# and MoE micro-benchmarks (bench/micro/cuda_*_bench; Google Benchmark is carried;
# PAGELLM_KERNEL_BENCHES names a subset, PAGELLM_KERNEL_BENCH_FILTER their rows;
# PAGELLM_KERNEL_BENCH_RUN=0 builds them without running).
# PAGELLM_CHECK_PREBUILT=DIR runs the binaries scripts/gpu-prebuild.sh built on another machine
# (DIR/tests/test_ops, DIR/tests/test_model, DIR/tools/pagellm) instead of configuring and
# building, after checking that they were built from these sources (scripts/source-hash.sh);
# PAGELLM_LLAMA_AB / PAGELLM_LLAMA2_AB / PAGELLM_DEEPSEEK_AB list settings (VAR=VALUE, several
# joined by "+") whose batch-1 latency is alternated for PAGELLM_AB_ROUNDS rounds (see
# ab_latency) on the Llama-3-8B, Llama-2-7B and DeepSeek-V2-Lite shapes; a setting PAGELLM_REV=<sha>
# runs the binary of that revision which scripts/gpu-prebuild.sh built (PAGELLM_PREBUILD_REVS).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
arch=${PAGELLM_CUDA_ARCH:-90a}
jobs=${JOBS:-16}
prebuilt=${PAGELLM_CHECK_PREBUILT:-}
build=${prebuilt:-${PAGELLM_BUILD_DIR:-build/cuda}}
logs=$build/gpu-check
declare -a step_names=() step_results=()
record() { step_names+=("$1"); step_results+=("$2"); }
now() { date +%s; }
deadline=$(( $(now) + ${PAGELLM_CHECK_BUDGET:-570} ))
# Seconds a step may take: its own cap, or what is left of the budget less 15s for the summary.
step_limit() {
  local left=$(( deadline - $(now) - 15 ))
  [ "$left" -lt 1 ] && left=1  # never 0: `timeout 0` means no limit
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

echo "== machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
command -v nvcc >/dev/null || export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
nvcc --version | tail -1
cmake --version | head -1

# --- dependencies: system first, the carried tree for whatever is missing ---
has_header() {
  local d
  for d in /usr/include /usr/local/include; do [ -e "$d/$1" ] && return 0; done
  return 1
}
missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
for pc in libpcre2-8 libxxhash sentencepiece; do
  command -v pkg-config >/dev/null && pkg-config --exists "$pc" || missing+=("$pc")
done
for h in nlohmann/json.hpp boost/version.hpp gtest/gtest.h gmock/gmock.h utf8proc.h; do
  has_header "$h" || missing+=("$h")
done
cmake_extra=()
# Prebuilt binaries need none of them: gpu-prebuild.sh puts the shared libraries they link beside
# them (.carry/prebuilt/lib), so .carry/pkg need not travel with them.
if [ ${#missing[@]} -gt 0 ] && [ -z "$prebuilt" ]; then
  echo "== dependencies missing on this system: ${missing[*]}"
  root=$repo/.carry/root
  if [ ! -d "$root" ]; then
    if [ ! -f .carry/pkg/deps.tar.gz ]; then
      echo "gpu-check: no .carry/pkg/deps.tar.gz: run scripts/carry-deps.sh on a Debian 12 machine" \
           "and bring .carry/pkg along" >&2
      exit 2
    fi
    tar -C .carry -xzf .carry/pkg/deps.tar.gz || { echo "gpu-check: cannot unpack deps" >&2; exit 2; }
  fi
  echo "   using the carried packages in $root"
  libdir=$root/usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH="$root/usr:$libdir/cmake:$root/usr/share/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CMAKE_LIBRARY_PATH="$libdir${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
  export CMAKE_INCLUDE_PATH="$root/usr/include${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}"
  export PKG_CONFIG_PATH="$libdir/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The system's pkg-config when there is one (the carried pkgconf needs a recent enough glibc).
  if command -v pkg-config >/dev/null; then
    cmake_extra+=("-DPKG_CONFIG_EXECUTABLE=$(command -v pkg-config)")
  else
    cmake_extra+=("-DPKG_CONFIG_EXECUTABLE=$root/usr/bin/pkgconf")
  fi
fi

# --- configure and build (or the prebuilt binaries, checked against these sources) ---
if command -v ninja >/dev/null; then export CMAKE_GENERATOR=Ninja; fi
mkdir -p "$logs"
t0=$(now)
if [ -n "$prebuilt" ]; then
  want=$(cat "$prebuilt/source-hash" 2>/dev/null || true)
  if [ -z "$want" ] || [ "$want" != "$(scripts/source-hash.sh)" ]; then
    echo "gpu-check: $prebuilt was not built from these sources: run scripts/gpu-prebuild.sh" \
         "and carry .carry/prebuilt again" >&2
    exit 2
  fi
  # The tests read tests/data from this copy, not from where they were built; the shared
  # libraries the binaries were linked with there come with them (scripts/gpu-prebuild.sh).
  export PAGELLM_SOURCE_DIR=$repo
  export LD_LIBRARY_PATH="$(cd "$prebuilt" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  record "configure" "prebuilt ($prebuilt, sources match)"
else
  echo "== configure (cuda preset, CUDA arch $arch, ${CMAKE_GENERATOR:-Unix Makefiles})"
  # Google Benchmark micro-benchmarks only for PAGELLM_CHECK_KERNEL_BENCH=1 (carried since 2026-11-30).
  micro=$([ "${PAGELLM_CHECK_KERNEL_BENCH:-0}" = 1 ] && echo ON || echo OFF)
  if cmake --preset cuda -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPAGELLM_BENCH=$micro ${cmake_extra[@]+"${cmake_extra[@]}"} \
       >"$logs/configure.log" 2>&1; then
    record "configure" "ok ($(( $(now) - t0 ))s)"
  else
    tail -40 "$logs/configure.log"
    record "configure" "FAILED (see $logs/configure.log)"
    printf '\n== summary\n'; for i in "${!step_names[@]}"; do printf '  %-28s %s\n' "${step_names[$i]}" "${step_results[$i]}"; done
    exit 1
  fi
fi

if [ "${PAGELLM_CHECK_CONFIGURE_ONLY:-0}" = 1 ] && [ -z "$prebuilt" ]; then
  grep -E "^(UTF8PROC_LIB|UTF8PROC_INCLUDE|Boost_DIR|GTest_DIR|nlohmann_json_DIR|PKG_CONFIG_EXECUTABLE):|^pkgcfg_lib_" \
    "$build/CMakeCache.txt" | grep -v ADVANCED
  echo "configure ok"; exit 0
fi

build_target() {  # name, targets...
  local name=$1; shift
  local t=$(now) limit
  if [ -n "$prebuilt" ]; then  # test_ops, test_model, pagellm and the benches gpu-prebuild built
    local target path
    for target in "$@"; do
      case $target in
        pagellm) path=$build/tools/pagellm ;;
        *_bench) path=$build/bench/$target ;;
        *) path=$build/tests/$target ;;
      esac
      if [ ! -x "$path" ]; then record "build $name" "not prebuilt"; return 1; fi
    done
    record "build $name" "prebuilt"
    return 0
  fi
  limit=$(step_limit 400)
  if [ "$limit" -lt 20 ]; then record "build $name" "skipped: out of time"; return 1; fi
  echo "== build $*"
  if timeout "$limit" cmake --build "$build" --target "$@" -j "$jobs" >"$logs/build-$name.log" 2>&1; then
    record "build $name" "ok ($(( $(now) - t ))s)"
    return 0
  fi
  grep -E "error|Error" "$logs/build-$name.log" | head -40
  record "build $name" "FAILED (see $logs/build-$name.log)"
  return 1
}
ops_built=0; model_built=0
if [ "${PAGELLM_CHECK_TESTS:-1}" = 1 ]; then
  build_target test_ops test_ops && ops_built=1
  build_target test_model test_model && model_built=1
fi
if [ "${PAGELLM_CHECK_ALL:-0}" = 1 ]; then build_target all all; fi

# --- op tests ---
ops_xml=$logs/test_ops.xml
if [ $ops_built = 1 ]; then
  echo "== test_ops"
  t=$(now)
  rm -f "$ops_xml"
  timeout "$(step_limit 240)" "$build/tests/test_ops" --gtest_output="xml:$ops_xml" \
    --gtest_filter="${PAGELLM_OPS_FILTER:-*}" >"$logs/test_ops.log" 2>&1
  rc=$?
  grep -E "^\[ +FAILED +\]|CHECK failed|CUDA error|cuBLAS error|^test_ops:" "$logs/test_ops.log" | sort -u | head -40
  if [ ! -f "$ops_xml" ]; then
    echo "test_ops ended without its report (crash?), rc=$rc; last lines of its log:"
    tail -40 "$logs/test_ops.log"
  fi
  case $rc in
    0) record "test_ops" "ok ($(( $(now) - t ))s)" ;;
    124) record "test_ops" "TIMEOUT ($(( $(now) - t ))s, see $logs/test_ops.log)" ;;
    *) record "test_ops" "FAILED rc=$rc ($(( $(now) - t ))s)" ;;
  esac
  # test_ops again under other settings: label, log name, then runs of "VAR=VALUE FILTER" each,
  # recorded as one step.
  ops_variants() {
    local label=$1 log=$logs/$2.log run ok=1 t
    shift 2
    if [ "${PAGELLM_CHECK_OPS_EXTRA:-1}" = 0 ]; then record "$label" "skipped (PAGELLM_CHECK_OPS_EXTRA=0)"; return; fi
    t=$(now)
    : >"$log"
    for run in "$@"; do
      env "${run%% *}" timeout "$(step_limit 60)" "$build/tests/test_ops" \
        --gtest_filter="${run#* }" >>"$log" 2>&1 || ok=0
    done
    if [ $ok = 1 ]; then
      record "$label" "ok ($(( $(now) - t ))s)"
    else
      grep -E "^\[ +FAILED +\]|CHECK failed" "$log" | head -20
      record "$label" "FAILED (see $log)"
    fi
  }
  # SwiGLU in the GEMV is on by default, the norm-weight fold off; the fold's backend path is
  # tested with it on (the kernels themselves are launched directly in the default run): with
  # SwiGLU, then alone (its norm in the GEMV, SiLU apart).
  ops_variants "test_ops (GEMV fusions on)" test_ops_fusions \
    "PAGELLM_GEMV_FUSIONS=fold,swiglu FusedProjection.*" \
    "PAGELLM_GEMV_FUSIONS=fold FusedProjection.FoldedNormWeight"
  # The routed experts' gate|up GEMV splits K at one token an expert by a rule of the shapes,
  # which picks none at most tests' sizes: every split is tested forced, 1, 2 and 4 warps a row.
  ops_variants "test_ops (MoE GEMV splits 1, 2, 4)" test_ops_moe_splits \
    "PAGELLM_MOE_GEMV_SPLIT=1 MoeExperts.*" "PAGELLM_MOE_GEMV_SPLIT=2 MoeExperts.*" \
    "PAGELLM_MOE_GEMV_SPLIT=4 MoeExperts.*"
  # Decode attention merges its splits within a thread-block cluster where they fit one (sm_90,
  # up to 16 blocks): the global merge it replaces, and portable cluster sizes only, forced.
  ops_variants "test_ops (decode merge: global, clusters of 8)" test_ops_decode_merge \
    "PAGELLM_DECODE_CLUSTER=0 AttentionDecode.*" "PAGELLM_DECODE_CLUSTER=8 AttentionDecode.*"
  # The streamed projection chain with the shallowest and the deepest ring it takes (the default
  # is three stages).
  ops_variants "test_ops (stream chain: 2, 6 stages)" test_ops_stream_stages \
    "PAGELLM_STREAM_STAGES=2 GemvStreamChain.*" "PAGELLM_STREAM_STAGES=6 GemvStreamChain.*"

  # Memcheck on the small cases of each op family: sanitized kernels run 10-100x slower.
  sanitizer=$(command -v compute-sanitizer || true)
  [ -z "$sanitizer" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] &&
    sanitizer=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
  if [ "${PAGELLM_CHECK_OPS_EXTRA:-1}" = 0 ]; then
    record "memcheck (reduced ops)" "skipped (PAGELLM_CHECK_OPS_EXTRA=0)"
    sanitizer=""
  elif [ -n "$sanitizer" ] && [ "$(step_limit 180)" -lt 30 ]; then
    record "memcheck (reduced ops)" "skipped: out of time"
  elif [ -n "$sanitizer" ]; then
    filter='Add.*:SiluMul.*:GatherRows.*:AddRmsNorm.*:Rope.*:RopeStoreKv.*:UploadWeight.DequantizesBlockFormatsToBf16'
    filter+=':Matmul.OddSizesBf16:Matmul.StridedAndUnalignedOutputs:Matmul.F16AndF32WeightsFallback'
    filter+=':AttentionDecode.HeadLayoutsAndDims:AttentionDecode.Gqa32x8SplitKv:AttentionDecode.MergedSplitsWithPadding'
    filter+=':AttentionDecode.ClusteredSplits'
    filter+=':AttentionPrefill.*'
    filter+=':MoeExperts.FixtureSizes:MoeExperts.ExpertsWithoutTokens:MoeExperts.TenExpertsPerToken'
    filter+=':AttentionMla.DecodeV2Lite:AttentionMla.LayoutsAndOptions:AttentionMla.ProjectedMerge'
    filter+=':BatchedMatmul.ShortRowsEveryWidth'
    filter+=':FusedProjection.GemvEveryBatchSize:ScaleColumns.*'
    filter+=':Sampling.PipelinedCallsAndTheTokensTheyHandOver:GemvStreamChain.*'
    echo "== compute-sanitizer memcheck ($filter)"
    t=$(now)
    limit=$(step_limit 180)
    timeout "$limit" "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 \
      "$build/tests/test_ops" --gtest_filter="$filter" >"$logs/memcheck.log" 2>&1
    rc=$?
    grep -E "=========|FAILED|test_ops:" "$logs/memcheck.log" | head -60
    case $rc in
      0) record "memcheck (reduced ops)" "ok ($(( $(now) - t ))s)" ;;
      124) record "memcheck (reduced ops)" "TIMEOUT after ${limit}s (see $logs/memcheck.log)" ;;
      99) record "memcheck (reduced ops)" "MEMORY ERRORS (see $logs/memcheck.log)" ;;
      *) record "memcheck (reduced ops)" "FAILED rc=$rc (see $logs/memcheck.log)" ;;
    esac
  else
    record "memcheck (reduced ops)" "skipped: no compute-sanitizer"
  fi
  # Racecheck (shared-memory hazards between a block's threads) on the attention kernels, whose
  # warps hand scores and probabilities to each other through shared memory (latent decode and
  # its merge with W_UV, GQA decode, tensor-core prefill), on the GEMV's split-K sums, and on the
  # routed experts' gate|up GEMV with its K split forced on (MoeExperts.GemvPathOnly runs no
  # cuBLASLt kernel: racecheck reports hazards inside cuBLASLt's, and compute-sanitizer 2025.3.1
  # fails when told to skip kernels by name). Not the streamed chain: racecheck takes its ring's
  # bulk copies as writes racing the consumers' reads, though each read waits on the stage's
  # mbarrier, which the copy completes (GemvStreamChain.ChainedEqualsPhaseByPhase holds a chain
  # to the same phases launched one by one, bit for bit).
  if [ -n "$sanitizer" ] && [ "$(step_limit 120)" -ge 30 ]; then
    filter='AttentionMla.LayoutsAndOptions:AttentionDecode.HeadLayoutsAndDims:AttentionDecode.MergedSplitsWithPadding'
    filter+=':AttentionDecode.ClusteredSplits:AttentionMla.ProjectedMerge'
    filter+=':AttentionPrefill.SlidingWindowAndSoftcap'
    filter+=':FusedProjection.GemvKSplits:MoeExperts.GemvPathOnly'
    echo "== compute-sanitizer racecheck ($filter)"
    t=$(now)
    limit=$(step_limit 120)
    PAGELLM_MOE_GEMV_SPLIT=2 timeout "$limit" "$sanitizer" --tool racecheck \
      --racecheck-report hazard --error-exitcode 99 --print-limit 20 "$build/tests/test_ops" \
      --gtest_filter="$filter" >"$logs/racecheck.log" 2>&1
    rc=$?
    grep -E "=========|FAILED" "$logs/racecheck.log" | head -30
    case $rc in
      0) record "racecheck (attention, GEMV)" "ok ($(( $(now) - t ))s)" ;;
      124) record "racecheck (attention, GEMV)" "TIMEOUT after ${limit}s (see $logs/racecheck.log)" ;;
      99) record "racecheck (attention, GEMV)" "HAZARDS (see $logs/racecheck.log)" ;;
      *) record "racecheck (attention, GEMV)" "FAILED rc=$rc (see $logs/racecheck.log)" ;;
    esac
  fi
fi

# --- golden model tests (CPU) ---
if [ $model_built = 1 ]; then
  echo "== test_model"
  t=$(now)
  # GoldenGguf converts checkpoints with the Python tools of .venv, which the GPU machine lacks;
  # CI runs it. Everything else (CPU golden, GoldenCuda, MoE) runs here.
  timeout "$(step_limit 240)" "$build/tests/test_model" \
    --gtest_filter="${PAGELLM_MODEL_FILTER:-*}-GoldenGguf.*" \
    >"$logs/test_model.log" 2>&1
  rc=$?
  grep -E "^\[ +(FAILED|PASSED) +\]|Failure" "$logs/test_model.log" | head -40
  record "test_model (golden)" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
  # The GPU golden and engine tests under one setting: label, log name, VAR=VALUE, filter.
  model_variant() {
    local t rc
    t=$(now)
    env "$3" timeout "$(step_limit 120)" "$build/tests/test_model" --gtest_filter="$4" \
      >"$logs/$2.log" 2>&1
    rc=$?
    grep -E "^\[ +(FAILED|PASSED) +\]|Failure" "$logs/$2.log" | head -20
    record "test_model (GPU, $1)" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
  }
  # The golden and engine tests on the GPU without SwiGLU in the gate|up GEMV (the default has
  # it; "none": the SiLU kernel apart), and the engine tests with the norm weights folded into
  # the projections (the fold's extra rounding of the weights puts 3 of the 13 golden fixtures
  # just outside their bound: docs/perf-history, eleventh round).
  # (The golden suite's name carries its instantiation prefix: AllArchitectures/GoldenCuda.)
  # PAGELLM_CHECK_FUSION_RUNS: other runs, "FUSIONS FILTER" each, separated by ";".
  IFS=';' read -ra fusion_runs <<<"${PAGELLM_CHECK_FUSION_RUNS:-none */GoldenCuda.*:EngineCuda.*;fold EngineCuda.*}"
  for run in "${fusion_runs[@]}"; do
    fusions=${run%% *}
    model_variant "$fusions" "test_model_$fusions" "PAGELLM_GEMV_FUSIONS=$fusions" "${run#* }"
  done
fi

# --- benchmarks (random weights of published shapes, bench/model-configs) ---
# PAGELLM_CHECK_BENCH=0 skips them. Each prints a JSON line kept in $logs/bench-*.json.
declare -a bench_rows=()
run_bench() {  # label, pagellm args...
  local label=$1; shift
  local t rc limit
  # PAGELLM_BENCH_ONLY=REGEX: only the benchmarks whose label matches (e.g. 'deepseek|mixtral').
  if [ -n "${PAGELLM_BENCH_ONLY:-}" ] && ! [[ $label =~ $PAGELLM_BENCH_ONLY ]]; then return; fi
  limit=$(step_limit 240)
  if [ "$limit" -lt 20 ]; then record "bench $label" "skipped: out of time"; return; fi
  t=$(now)
  # A setting PAGELLM_REV=<sha> runs that revision's binary (scripts/gpu-prebuild.sh with
  # PAGELLM_PREBUILD_REVS) instead of the sources'.
  local bin=$build/tools/pagellm w
  for w in ${bench_env:-}; do
    if [[ $w == PAGELLM_REV=* ]]; then bin=$build/rev/${w#PAGELLM_REV=}/pagellm; fi
  done
  if [ ! -x "$bin" ]; then
    record "bench $label" "FAILED: no $bin (scripts/gpu-prebuild.sh with PAGELLM_PREBUILD_REVS)"
    return
  fi
  # shellcheck disable=SC2086  # bench_env: VAR=VALUE words, set by ab_latency
  timeout "$limit" env ${bench_env:-} "$bin" bench "$@" --json \
    >"$logs/bench-$label.log" 2>&1
  rc=$?
  tail -1 "$logs/bench-$label.log" >"$logs/bench-$label.json"
  grep -vE '^\{' "$logs/bench-$label.log" | grep -v INFO | sed 's/^/    /'
  # PAGELLM_CHAIN_TIMES=1 in a setting: the chain's phase times, logged as the run ends.
  grep -E 'INFO (stream chain times|  phase [0-9])' "$logs/bench-$label.log" | sed 's/^.*INFO /    /'
  # A model larger than this GPU (Mixtral-8x7B's 93 GB on an 80 GB card) is the card's limit,
  # not a failure: pagellm says so as it stops loading ("... is out of memory for ... of weights)").
  local oom
  oom=$(grep -m1 -oE 'is out of memory for .* of weights\): .*' "$logs/bench-$label.log")
  if [ "$rc" != 0 ] && [ -n "$oom" ]; then
    record "bench $label" "does not fit this GPU: $oom"
    return
  fi
  record "bench $label" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
  bench_rows+=("$label|$(tail -1 "$logs/bench-$label.log")")
}
# A/B rounds of batch-1 latency: the settings of a list run in turn, for PAGELLM_AB_ROUNDS rounds
# (default 2; 0 skips them). A setting is VAR=VALUE, or several joined by "+", put in the
# benchmark's environment and, less the PAGELLM_ prefix, in its label. Runs of one binary differ
# by ~1%, about what each setting may gain, hence the alternation on one machine.
ab_latency() {  # label, settings, pagellm latency args...
  local label=$1 settings=$2 round s
  shift 2
  for ((round = 1; round <= ${PAGELLM_AB_ROUNDS:-2}; round++)); do
    for s in $settings; do
      bench_env=${s//+/ } run_bench "$label-r$round-${s//PAGELLM_/}" latency "$@"
    done
  done
}
if [ "${PAGELLM_CHECK_BENCH:-1}" = 1 ]; then
  if build_target pagellm pagellm; then
    cfg=bench/model-configs
    echo "== bench"
    run_bench latency-llama3-8b latency --model $cfg/llama-3-8b.json --load-format dummy --device cuda \
      --input-len 512 --output-len 256 --iters 2
    # PAGELLM_LLAMA_AB: the settings alternated (default: the GEMV fusions, none against SwiGLU
    # in the gate|up GEMV, the default; PAGELLM_GEMV_FUSIONS=fold,swiglu adds the folded pre-norm
    # weights).
    ab_latency latency-llama3-8b "${PAGELLM_LLAMA_AB:-PAGELLM_GEMV_FUSIONS=none PAGELLM_GEMV_FUSIONS=swiglu}" \
      --model $cfg/llama-3-8b.json --load-format dummy --device cuda --input-len 512 \
      --output-len 256 --iters 2
    # Per-op time of one 512-token prefill and of the decode step after it (ops one by one, CUDA
    # events around each): the tables are in $logs/bench-profile-llama3-8b.log, and in its .json.
    run_bench profile-llama3-8b latency --profile --model $cfg/llama-3-8b.json --load-format dummy \
      --device cuda --input-len 512 --output-len 8 --iters 2
    # PAGELLM_CHECK_NSYS=1: the decode loop as it really runs (graph replays included) under Nsight
    # Systems; its per-kernel summary is the breakdown --profile cannot give for recorded graphs.
    if [ "${PAGELLM_CHECK_NSYS:-0}" = 1 ]; then
      nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
      if [ -n "$nsys" ] && [ "$(step_limit 120)" -ge 60 ]; then
        echo "== nsys: decode kernels (Llama-3-8B shape, batch 1)"
        t=$(now)
        timeout "$(step_limit 120)" "$nsys" profile -o "$logs/decode" --force-overwrite true \
          --cuda-graph-trace=node "$build/tools/pagellm" bench latency --model $cfg/llama-3-8b.json \
          --load-format dummy --device cuda --input-len 512 --output-len 128 --iters 1 \
          >"$logs/nsys.log" 2>&1 &&
          "$nsys" stats --report cuda_gpu_kern_sum --format csv --output "$logs/decode" \
            "$logs/decode.nsys-rep" >>"$logs/nsys.log" 2>&1
        python3 - "$logs/decode_cuda_gpu_kern_sum.csv" <<'PY' || tail -20 "$logs/nsys.log"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"  {'kernel':70s} {'calls':>7s} {'total ms':>9s} {'share':>6s} {'avg us':>8s}")
for r in rows[:25]:
    t = float(r["Total Time (ns)"])
    print(f"  {r['Name'][:70]:70s} {int(r['Instances']):7d} {t/1e6:9.2f} {100*t/total:5.1f}% {float(r['Avg (ns)'])/1e3:8.1f}")
print(f"  total kernel time {total/1e6:.2f} ms")
PY
        record "nsys decode kernels" "done ($(( $(now) - t ))s)"
      else
        record "nsys decode kernels" "skipped: no nsys or no time"
      fi
    fi
    # The first request's time to the first token on a fresh engine against the later ones'
    # (issue 6: within 1.5x), one request at a time, after a 2,047-token profile step: the
    # issue's 512-token prompt, and 437 tokens, a length none of the start-up steps has (its
    # GEMM kernels come from the start-up's preload: docs/perf-history, nineteenth round).
    ttft_args=(--load-format dummy --device cuda --num-prompts 4 --output-len 4 --temperature 0
      --sequential --max-num-batched-tokens 2048 --max-model-len 2048)
    for n in 512 437; do
      run_bench ttft-llama3-8b-$n throughput --model $cfg/llama-3-8b.json --input-len $n \
        "${ttft_args[@]}"
    done
    run_bench latency-llama2-7b latency --model $cfg/llama-2-7b.json --load-format dummy --device cuda \
      --input-len 512 --output-len 256 --iters 2
    # PAGELLM_LLAMA2_AB: settings alternated on the Llama-2-7B shape too (none by default).
    if [ -n "${PAGELLM_LLAMA2_AB:-}" ]; then
      ab_latency latency-llama2-7b "$PAGELLM_LLAMA2_AB" --model $cfg/llama-2-7b.json \
        --load-format dummy --device cuda --input-len 512 --output-len 256 --iters 2
    fi
    # PAGELLM_CHECK_MOE=1: the Mixtral-8x7B shape (93 GB of random bf16 weights, routed experts on
    # the device): batch-1 latency, then the per-op tables of a prefill and a decode step; then
    # the DeepSeek-V2-Lite shape.
    if [ "${PAGELLM_CHECK_MOE:-0}" = 1 ]; then
      run_bench latency-mixtral-8x7b latency --model $cfg/mixtral-8x7b.json --load-format dummy \
        --device cuda --input-len 512 --output-len 128 --iters 2
      run_bench profile-mixtral-8x7b latency --profile --model $cfg/mixtral-8x7b.json \
        --load-format dummy --device cuda --input-len 512 --output-len 8 --iters 1
      # DeepSeek-V2-Lite (31 GB of random bf16 weights; MLA's latent attention and DeepSeekMoE on
      # the device): batch-1 latency, the per-op tables, and issue 8's offline run of 200 x (1000
      # in, 100 out).
      run_bench latency-deepseek-v2-lite latency --model $cfg/deepseek-v2-lite.json \
        --load-format dummy --device cuda --input-len 512 --output-len 128 --iters 2
      # PAGELLM_DEEPSEEK_AB: the settings alternated (default: the one-token down products and
      # combine in one kernel against two, a tie when last measured: docs/TUNING.md).
      ab_latency latency-deepseek-v2-lite \
        "${PAGELLM_DEEPSEEK_AB:-PAGELLM_MOE_FUSED_COMBINE=1 PAGELLM_MOE_FUSED_COMBINE=0}" \
        --model $cfg/deepseek-v2-lite.json --load-format dummy --device cuda --input-len 512 \
        --output-len 128 --iters 2
      run_bench profile-deepseek-v2-lite latency --profile --model $cfg/deepseek-v2-lite.json \
        --load-format dummy --device cuda --input-len 512 --output-len 8 --iters 1
      run_bench ttft-deepseek-v2-lite-437 throughput --model $cfg/deepseek-v2-lite.json \
        --input-len 437 "${ttft_args[@]}"
      # 1,500 tokens: enough per expert for the per-expert cuBLASLt GEMMs, a plan per expert's
      # row count (each queried on the step's path until the twentieth round: 2.7-3x).
      run_bench ttft-deepseek-v2-lite-1500 throughput --model $cfg/deepseek-v2-lite.json \
        --input-len 1500 "${ttft_args[@]}"
      # 16 prompts of 1000 tokens per step: the routed experts' GEMMs grow with the step, and
      # the per-layer wait for the routing counts is paid once per step.
      run_bench throughput-deepseek-v2-lite throughput --model $cfg/deepseek-v2-lite.json \
        --load-format dummy --device cuda --num-prompts 200 --input-len 1000 --output-len 100 \
        --max-num-seqs 256 --max-num-batched-tokens 16384
    fi
    run_bench throughput-llama3-8b throughput --model $cfg/llama-3-8b.json --load-format dummy \
      --device cuda --num-prompts ${PAGELLM_BENCH_PROMPTS:-1000} --input-len 512 --output-len 256 \
      --max-num-seqs ${PAGELLM_OFFLINE_SEQS:-512} --max-num-batched-tokens ${PAGELLM_OFFLINE_TOKENS:-16384}
    # PAGELLM_CHECK_STRUCTURED=1: structured outputs (issue 45) on the Llama-3-8B shape at 64 and
    # 256 sequences, temperature 1, every request bound to bench/schemas/order.json against none
    # (the test Llama-3 tokenizer beside the random weights: masks over the full 128,256 ids).
    if [ "${PAGELLM_CHECK_STRUCTURED:-0}" = 1 ]; then
      for b in 64 256; do
        for s in none order; do
          schema=()
          # The constrained run is followed by the same work unconstrained: new prompts of the
          # same lengths, each generating as many tokens as its constrained counterpart did.
          [ "$s" = order ] && schema=(--json-schema bench/schemas/order.json --unconstrained-baseline)
          run_bench structured-llama3-8b-b$b-$s throughput --model $cfg/llama-3-8b.json \
            --load-format dummy --device cuda --tokenizer tests/data/tokenizer/llama3 \
            --num-prompts $((b * 2)) --input-len 256 --output-len 256 --max-num-seqs $b \
            --temperature 1 "${schema[@]}"
        done
      done
    fi
    # PAGELLM_CHECK_SPEC=1: speculative decoding (issue 46) on the Llama-3-8B shape, greedy,
    # 512-token prompts: none; a draft model equal to the target (the same random weights: every
    # guess right but near-ties, the upper bound, and what drafting and verifying cost); prompt
    # lookup, whose guesses random weights make wrong (its cost when it misses). Batch 1 and 8.
    if [ "${PAGELLM_CHECK_SPEC:-0}" = 1 ]; then
      spec_args=(--model $cfg/llama-3-8b.json --load-format dummy --device cuda --input-len 512
        --output-len 128 --temperature 0 --max-model-len 1024)
      for b in 1 8; do
        batch=(--num-prompts $((b * 2)) --max-num-seqs $b)
        [ "$b" = 1 ] && batch=(--num-prompts 3 --sequential)
        run_bench spec-llama3-8b-b$b-none throughput "${spec_args[@]}" "${batch[@]}"
        run_bench spec-llama3-8b-b$b-draft throughput "${spec_args[@]}" "${batch[@]}" \
          --speculative-model $cfg/llama-3-8b.json
        run_bench spec-llama3-8b-b$b-ngram throughput "${spec_args[@]}" "${batch[@]}" \
          --speculative-method ngram
      done
      # DeepSeek's MTP layer: the DeepSeek-V2-Lite shape with one MTP layer added (V3's own
      # shape does not fit one GPU), batch 1. Random weights make its guesses wrong: what the
      # layer costs a step when it misses.
      v2l_mtp=$(mktemp --suffix=.json)
      python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_nextn_predict_layers"] = 1; json.dump(c, open(sys.argv[2], "w"))' \
        $cfg/deepseek-v2-lite.json "$v2l_mtp"
      mtp_args=(--model "$v2l_mtp" --load-format dummy --device cuda --input-len 512
        --output-len 128 --temperature 0 --max-model-len 1024 --num-prompts 3 --sequential)
      run_bench spec-v2-lite-b1-none throughput "${mtp_args[@]}"
      run_bench spec-v2-lite-b1-mtp throughput "${mtp_args[@]}" --speculative-method mtp
    fi
    # Quantized weights: the Llama-3-8B shape with random 4-bit AWQ-style projections (issue 43:
    # group 128, bf16 lm_head) and FP8 ones (issue 44: per channel, and per 128 columns of a row
    # as block-scaled checkpoints have): batch-1 latency, its per-op tables, and the offline run.
    # PAGELLM_CHECK_INT4=0 / PAGELLM_CHECK_FP8=0 skip them.
    quantized=()
    [ "${PAGELLM_CHECK_INT4:-1}" = 1 ] && quantized+=(awq)
    [ "${PAGELLM_CHECK_FP8:-1}" = 1 ] && quantized+=(fp8 fp8-block)
    for q in ${quantized[@]+"${quantized[@]}"}; do
      run_bench latency-llama3-8b-$q latency --model $cfg/llama-3-8b.json --load-format dummy \
        --quantization $q --device cuda --input-len 512 --output-len 256 --iters 2
      run_bench profile-llama3-8b-$q latency --profile --model $cfg/llama-3-8b.json \
        --load-format dummy --quantization $q --device cuda --input-len 512 --output-len 8 --iters 1
      run_bench throughput-llama3-8b-$q throughput --model $cfg/llama-3-8b.json --load-format dummy \
        --quantization $q --device cuda --num-prompts ${PAGELLM_BENCH_PROMPTS:-1000} --input-len 512 \
        --output-len 256 --max-num-seqs ${PAGELLM_OFFLINE_SEQS:-512} \
        --max-num-batched-tokens ${PAGELLM_OFFLINE_TOKENS:-16384}
    done
    # Quantized routed experts (issues 43, 44): the DeepSeek-V2-Lite shape with random AWQ-style
    # 4-bit weights and with 128 x 128 block FP8 ones (experts, shared experts and dense
    # projections; MLA's kv_b and the lm_head bf16): batch-1 latency, its per-op table, and issue
    # 8's offline run; bf16's are the MoE set above.
    if [ "${PAGELLM_CHECK_MOE:-0}" = 1 ]; then
      moe_quantized=()
      [ "${PAGELLM_CHECK_INT4:-1}" = 1 ] && moe_quantized+=(awq)
      [ "${PAGELLM_CHECK_FP8:-1}" = 1 ] && moe_quantized+=(fp8-block)
      for q in ${moe_quantized[@]+"${moe_quantized[@]}"}; do
        run_bench latency-deepseek-v2-lite-$q latency --model $cfg/deepseek-v2-lite.json \
          --load-format dummy --quantization $q --device cuda --input-len 512 --output-len 128 \
          --iters 2
        run_bench profile-deepseek-v2-lite-$q latency --profile --model $cfg/deepseek-v2-lite.json \
          --load-format dummy --quantization $q --device cuda --input-len 512 --output-len 8 --iters 1
        run_bench throughput-deepseek-v2-lite-$q throughput --model $cfg/deepseek-v2-lite.json \
          --load-format dummy --quantization $q --device cuda --num-prompts 200 --input-len 1000 \
          --output-len 100 --max-num-seqs 256 --max-num-batched-tokens 16384
      done
    fi
    # PAGELLM_CHECK_PROFILE_OFFLINE=1: where an offline run's time goes, op by op (`bench
    # throughput --profile`: eager, every op timed, summed per op kind and weight shape; the
    # table is in $logs/bench-profile-offline-*.log). Fewer prompts than the timed run.
    if [ "${PAGELLM_CHECK_PROFILE_OFFLINE:-0}" = 1 ]; then
      run_bench profile-offline-llama3-8b throughput --profile --model $cfg/llama-3-8b.json \
        --load-format dummy --device cuda --num-prompts 300 --input-len 512 --output-len 256 \
        --max-num-seqs ${PAGELLM_OFFLINE_SEQS:-512} --max-num-batched-tokens ${PAGELLM_OFFLINE_TOKENS:-16384}
      if [ "${PAGELLM_CHECK_MOE:-0}" = 1 ]; then
        run_bench profile-offline-deepseek-v2-lite throughput --profile \
          --model $cfg/deepseek-v2-lite.json --load-format dummy --device cuda --num-prompts 100 \
          --input-len 1000 --output-len 100 --max-num-seqs 256 --max-num-batched-tokens 16384
      fi
    fi
    # The server on the GPU: a real `pagellm serve --device cuda` answering a completion, on the
    # bf16 Llama fixture and on the DeepSeek-V3-layout FP8 checkpoint (block scales, MLA, MoE).
    for served in llama fp8_deepseek_v3_block; do
      t=$(now)
      "$build/tools/pagellm" serve --model tests/data/golden/$served --device cuda --port 0 \
        >"$logs/serve-$served.log" 2>&1 &
      serve_pid=$!
      for _ in $(seq 1 60); do grep -q "listening on" "$logs/serve-$served.log" && break; sleep 0.5; done
      url=$(grep -o "http://[0-9.:]*" "$logs/serve-$served.log" | head -1)
      if [ -n "$url" ] && curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
          -d '{"model": "tests/data/golden/'$served'", "prompt": [5, 17, 42], "max_tokens": 8, "temperature": 0, "return_token_ids": true}' \
          >"$logs/serve-$served-response.json"; then
        record "serve --device cuda ($served)" "ok ($(( $(now) - t ))s): $(head -c 160 "$logs/serve-$served-response.json")"
      else
        record "serve --device cuda ($served)" "FAILED (see $logs/serve-$served.log)"
        tail -5 "$logs/serve-$served.log"
      fi
      kill -TERM $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null
    done

    # The online serving benchmark of docs/BENCHMARKS.md (PAGELLM_CHECK_SERVE_BENCH=1): `bench
    # serve` starts `pagellm serve --device cuda` on random Llama-3-8B weights (the child reads
    # PAGELLM_LOAD_FORMAT etc. from the environment) and sweeps Poisson arrival rates.
    if [ "${PAGELLM_CHECK_SERVE_BENCH:-0}" = 1 ]; then
      t=$(now)
      limit=$(step_limit 400)
      PAGELLM_LOAD_FORMAT=dummy PAGELLM_MAX_NUM_SEQS=256 PAGELLM_MAX_NUM_BATCHED_TOKENS=8192 \
        timeout "$limit" "$build/tools/pagellm" bench serve --model bench/model-configs/llama-3-8b.json \
        --device cuda --num-prompts 200 --input-len 576 --input-len-dist uniform:128,1024 \
        --output-len 128 --random-vocab-size 128000 --sweep-rate ${PAGELLM_SERVE_RATES:-2,8,20,inf} \
        --slo ttft=1000,tpot=30 --num-warmups 2 --gpu H200 --precision bf16 \
        --extra-body '{"return_token_ids": true}' \
        --output-json "$logs/bench-serve.json" >"$logs/bench-serve.log" 2>&1
      rc=$?
      grep -v INFO "$logs/bench-serve.log" | tail -60
      record "bench serve (online)" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
    fi
    # PAGELLM_CHECK_BATCHING=1: the three batching policies of docs/BENCHMARKS.md on one seeded
    # stream (same prompts, same arrival times) at PAGELLM_BATCHING_RATE req/s.
    if [ "${PAGELLM_CHECK_BATCHING:-0}" = 1 ]; then
      for policy in continuous static:64 dynamic:64,50; do
        t=$(now)
        limit=$(step_limit 120)
        if [ "$limit" -lt 30 ]; then record "bench serve --batching $policy" "skipped: out of time"; continue; fi
        tag=${policy%%:*}
        PAGELLM_LOAD_FORMAT=dummy PAGELLM_MAX_NUM_SEQS=256 PAGELLM_MAX_NUM_BATCHED_TOKENS=8192 \
          PAGELLM_BATCHING=$policy timeout "$limit" "$build/tools/pagellm" bench serve \
          --model bench/model-configs/llama-3-8b.json --device cuda --num-prompts 200 --input-len 576 \
          --input-len-dist uniform:128,1024 --output-len 128 --random-vocab-size 128000 \
          --request-rate ${PAGELLM_BATCHING_RATE:-20} --seed 7 --slo ttft=1000,tpot=30 --gpu H200 \
          --precision bf16 --extra-body '{"return_token_ids": true}' \
          --output-json "$logs/bench-serve-$tag.json" >"$logs/bench-serve-$tag.log" 2>&1
        rc=$?
        grep -v INFO "$logs/bench-serve-$tag.log" | grep -iE "throughput|ttft|tpot|busy|goodput|completed" | head -12 | sed 's/^/    /'
        record "bench serve --batching $policy" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
      done
    fi
  fi
fi

# --- kernel micro-benchmarks (PAGELLM_CHECK_KERNEL_BENCH=1) ---
# Decode and prefill attention, the routed experts and the decode GEMVs per layer call, and
# cuBLASLt's candidates for the prefill-sized products (bench/micro/cuda_*_bench: Llama-3-8B heads
# and projections, DeepSeek-V2-Lite MLA and MoE, Mixtral MoE): the loop for working on them.
if [ "${PAGELLM_CHECK_KERNEL_BENCH:-0}" = 1 ]; then
  # PAGELLM_KERNEL_BENCHES narrows the list (space-separated names).
  for b in ${PAGELLM_KERNEL_BENCHES:-cuda_attention_decode_bench cuda_moe_bench cuda_attention_prefill_bench cuda_gemv_bench cuda_gemm_bench}; do
    build_target "$b" "$b" || continue
    [ "${PAGELLM_KERNEL_BENCH_RUN:-1}" = 1 ] || continue  # 0: build only (scripts/ab-bench.sh)
    t=$(now)
    echo "== $b"
    # PAGELLM_KERNEL_BENCH_FILTER: a Google Benchmark filter for every bench run (a few rows).
    timeout "$(step_limit 150)" "$build/bench/$b" \
      ${PAGELLM_KERNEL_BENCH_FILTER:+--benchmark_filter="$PAGELLM_KERNEL_BENCH_FILTER"} \
      >"$logs/$b.log" 2>&1
    rc=$?
    grep -E "^BM_" "$logs/$b.log" | sed 's/^/  /'
    record "$b" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc") ($(( $(now) - t ))s)"
  done
fi

# --- summary ---
if [ ${#bench_rows[@]} -gt 0 ]; then
  printf '\n== benchmarks\n'
  for row in "${bench_rows[@]}"; do
    label=${row%%|*}; json=${row#*|}
    python3 - "$label" "$json" <<'PY' 2>/dev/null || printf '  %-24s %s\n' "$label" "$json"
import json, sys
label, j = sys.argv[1], json.loads(sys.argv[2])
if "profile" in j:
    def step(name):
        p = j["profile"][name]
        wall = f" of {p['wall_ms']:.2f} ms wall" if p["wall_ms"] else ""
        return f"{name} ops {p['sum_ms']:.2f} ms{wall}"
    print(f"  {label:<24} {step('prefill')}, {step('decode')} (tables in the log)")
elif "decode_tokens_per_s" in j:
    queued = j.get("decode_back_to_back_tokens_per_s")
    queued = f" (queued {queued:.1f})" if queued else ""
    print(f"  {label:<24} decode {j['decode_tokens_per_s']:8.1f} tok/s{queued} ({100*j['bandwidth_fraction']:.0f}% of "
          f"{j['memory_bandwidth_gb_per_s']:.0f} GB/s), prefill {j['prefill_tokens_per_s']:9.1f} tok/s, load {j['load_seconds']:.1f} s")
elif label.startswith("ttft-") and j.get("later_ttft_ms"):
    print(f"  {label:<24} first request's TTFT {j['first_ttft_ms']:.2f} ms, "
          f"{j['first_ttft_ms'] / j['later_ttft_ms']:.2f}x the later ones' {j['later_ttft_ms']:.2f} ms")
else:
    host = j.get("engine_host_seconds")
    host = f", host work {100 * host / j['elapsed_s']:.1f}%" if host is not None and j.get("elapsed_s") else ""
    print(f"  {label:<24} {j['requests_per_s']:.2f} req/s, {j['total_tokens_per_s']:.0f} total tok/s, "
          f"{j['output_tokens_per_s']:.0f} output tok/s, {j['failed']} failed{host}")
PY
  done
fi
printf '\n== op tests\n'
if [ -f "$ops_xml" ] && command -v python3 >/dev/null; then
  python3 - "$ops_xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
n_pass = n_fail = 0
failures = []
for case in root.iter("testcase"):
    name = case.get("classname") + "." + case.get("name")
    msgs = [f.get("message", "") for f in case.findall("failure")]
    failure = case.find("failure")
    skipped = case.get("result") == "skipped" or case.find("skipped") is not None
    status = "FAILED" if failure is not None else ("skipped" if skipped else "passed")
    if failure is not None:
        n_fail += 1
        failures.append((name, msgs))
    elif not skipped:
        n_pass += 1
    print(f"  {name:<48} {status:<8} {float(case.get('time', 0)):7.2f}s")
print(f"  {'total':<48} {n_pass} passed, {n_fail} failed")
for name, msgs in failures:
    print(f"\n  -- {name}: {len(msgs)} failed check(s); the first:")
    for msg in msgs[:3]:
        print("\n".join("     " + l for l in msg.splitlines()[:10])[:900])
PY
elif [ -f "$logs/test_ops.log" ]; then
  grep -E "^\[ +(PASSED|FAILED) +\]" "$logs/test_ops.log"
else
  echo "  (not run)"
fi
if [ -n "${PAGELLM_CHECK_ARCHIVE:-}" ]; then
  tar --exclude='*.nsys-rep' --exclude='*.sqlite' -czf "$PAGELLM_CHECK_ARCHIVE" \
    -C "$(dirname "$logs")" "$(basename "$logs")" || echo "gpu-check: cannot write $PAGELLM_CHECK_ARCHIVE"
fi
printf '\n== summary\n'
for i in "${!step_names[@]}"; do printf '  %-28s %s\n' "${step_names[$i]}" "${step_results[$i]}"; done
printf '  %-28s %ss\n' "total" "$(( $(now) - t0 ))"
for r in "${step_results[@]}"; do case $r in ok*|skipped*|prebuilt*) ;; *) exit 1 ;; esac; done
exit 0
