#!/usr/bin/env bash
# Same-machine A/B of decode and prefill speed between revisions. GPU machines differ by a few
# percent from one to the next, more than most single changes move a figure, so a change is judged
# by building its revision and the one before side by side on one machine and alternating their
# benchmarks there.
#
#   scripts/ab-bench.sh pack REV...   # here: one archive per revision, .carry/ab/<n>-<rev>.tar.gz
#   scripts/ab-bench.sh run           # on the GPU machine, from a copy of the repository that has
#                                     # .carry/pkg and .carry/ab: builds every archive (with
#                                     # scripts/gpu-check.sh, tests off) and alternates
#                                     # `pagellm bench latency` over them, printing a table last
# Environment for run: PAGELLM_AB_MODELS (bench/model-configs names; default "llama-3-8b
# llama-2-7b deepseek-v2-lite"; "none" for none), PAGELLM_AB_ROUNDS (default 2),
# PAGELLM_AB_OUTPUT_LEN (256; MoE shapes take half), PAGELLM_AB_DIR (where the trees are built; default /tmp/pagellm-ab),
# PAGELLM_AB_THROUGHPUT=1 (each round also runs issue 6's offline Llama-3-8B run, 1000 x (512 in,
# 256 out), reported in total tok/s), PAGELLM_AB_OFFLINE (the offline runs by name instead:
# "llama-3-8b", "deepseek-v2-lite" for issue 8's 200 x (1000 in, 100 out), reported in req/s, or both), PAGELLM_AB_KERNEL_BENCH=NAME (each round also runs that
# bench/micro benchmark of every revision, e.g. cuda_attention_decode_bench, narrowed by
# PAGELLM_AB_KERNEL_FILTER, a --benchmark_filter regex; its lines are printed last).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

pack() {
  [ $# -ge 1 ] || { echo "usage: $0 pack REV..." >&2; exit 2; }
  rm -rf .carry/ab
  mkdir -p .carry/ab
  local i=0
  for rev in "$@"; do
    local sha
    sha=$(git rev-parse --short "$rev^{commit}")
    i=$((i + 1))
    git archive --format=tar.gz -o ".carry/ab/$i-$sha.tar.gz" "$sha"
    echo ".carry/ab/$i-$sha.tar.gz"
  done
}

run() {
  local dir=${PAGELLM_AB_DIR:-/tmp/pagellm-ab}
  local models=${PAGELLM_AB_MODELS:-llama-3-8b llama-2-7b deepseek-v2-lite}
  [ "$models" = none ] && models=""
  local rounds=${PAGELLM_AB_ROUNDS:-2} out_len=${PAGELLM_AB_OUTPUT_LEN:-256}
  local offline=${PAGELLM_AB_OFFLINE:-}
  [ -z "$offline" ] && [ "${PAGELLM_AB_THROUGHPUT:-0}" = 1 ] && offline=llama-3-8b
  [ -f .carry/pkg/deps.tar.gz ] || { echo "missing .carry/pkg/deps.tar.gz (scripts/carry-deps.sh)" >&2; exit 2; }
  local -a names=()
  for a in .carry/ab/*.tar.gz; do
    [ -f "$a" ] || { echo "no archives in .carry/ab ($0 pack REV...)" >&2; exit 2; }
    names+=("$(basename "$a" .tar.gz)")
  done
  # Builds side by side; the machine's cores are shared between them.
  local jobs=$(( $(nproc) / ${#names[@]} ))
  [ "$jobs" -ge 1 ] || jobs=1
  local -a pids=()
  for n in "${names[@]}"; do
    rm -rf "${dir:?}/$n"
    mkdir -p "$dir/$n/.carry"
    tar -xzf ".carry/ab/$n.tar.gz" -C "$dir/$n"
    cp -r .carry/pkg "$dir/$n/.carry/"
    local kb=${PAGELLM_AB_KERNEL_BENCH:-}
    (cd "$dir/$n" && JOBS=$jobs PAGELLM_CHECK_TESTS=0 PAGELLM_BENCH_ONLY=none \
       PAGELLM_CHECK_KERNEL_BENCH=$([ -n "$kb" ] && echo 1 || echo 0) PAGELLM_KERNEL_BENCHES="$kb" \
       PAGELLM_KERNEL_BENCH_RUN=0 scripts/gpu-check.sh >"$dir/$n.build.log" 2>&1) &
    pids+=($!)
  done
  local failed=0
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}" || [ ! -x "$dir/${names[$i]}/build/cuda/tools/pagellm" ]; then
      echo "build of ${names[$i]} failed:" >&2
      tail -20 "$dir/${names[$i]}.build.log" >&2
      failed=1
    fi
  done
  [ "$failed" = 0 ] || exit 1
  # Rounds alternate the revisions, so a drift of the machine's speed reaches each alike.
  local results=$dir/results.txt
  : >"$results"
  : >"$dir/kernel-results.txt"
  for r in $(seq 1 "$rounds"); do
    for m in $models; do
      local len=$out_len
      case $m in deepseek*|mixtral*) len=$((out_len / 2)) ;; esac
      for n in "${names[@]}"; do
        local bin=$dir/$n/build/cuda/tools/pagellm
        local log=$dir/$n.$m.$r.log
        if "$bin" bench latency --model "$dir/$n/bench/model-configs/$m.json" --load-format dummy \
             --device cuda --input-len 512 --output-len "$len" >"$log" 2>&1; then
          local dec pre
          dec=$(awk '/^decode/ {print $(NF-1)}' "$log")
          pre=$(awk '/^prefill/ {print $(NF-1)}' "$log")
          echo "$m $n $r $dec $pre" | tee -a "$results"
        else
          echo "$m $n $r FAILED (see $log)" | tee -a "$results"
        fi
      done
    done
    if [ -n "${PAGELLM_AB_KERNEL_BENCH:-}" ]; then
      for n in "${names[@]}"; do
        "$dir/$n/build/cuda/bench/$PAGELLM_AB_KERNEL_BENCH" \
          --benchmark_filter="${PAGELLM_AB_KERNEL_FILTER:-.}" 2>&1 | grep -E "^BM_" |
          sed "s/^/$n round $r: /" >>"$dir/kernel-results.txt" || true
      done
    fi
    for o in $offline; do
      for n in "${names[@]}"; do
        local log=$dir/$n.offline-$o.$r.log
        local -a args=(--num-prompts 1000 --input-len 512 --output-len 256 --max-num-seqs 512)
        local unit=total
        if [ "$o" = deepseek-v2-lite ]; then
          args=(--num-prompts 200 --input-len 1000 --output-len 100 --max-num-seqs 256)
          unit=requests/s
        fi
        if "$dir/$n/build/cuda/tools/pagellm" bench throughput \
             --model "$dir/$n/bench/model-configs/$o.json" --load-format dummy --device cuda \
             "${args[@]}" --max-num-batched-tokens 16384 >"$log" 2>&1; then
          local v
          # "throughput: X req/s, Y total tok/s, ...": the figure before the unit.
          v=$(awk -v u="$unit" '/^throughput/ {for (i = 1; i < NF; ++i) if ($(i + 1) == u || $(i + 1) == u ",") print $i}' "$log")
          echo "offline-$o $n $r ${v%,} -" | tee -a "$results"
        else
          echo "offline-$o $n $r FAILED (see $log)" | tee -a "$results"
        fi
      done
    done
  done
  printf '\n== decode tok/s (prefill tok/s), one column per round; offline: Llama total tok/s, V2-Lite req/s\n'
  local shown=$models
  for o in $offline; do shown="$shown offline-$o"; done
  for m in $shown; do
    for n in "${names[@]}"; do
      printf '  %-18s %-16s' "$m" "$n"
      awk -v m="$m" -v n="$n" '$1 == m && $2 == n {
        if ($4 == "FAILED") printf "  FAILED"; else printf "  %s (%s)", $4, $5 } END { print "" }' "$results"
    done
  done
  if [ -s "$dir/kernel-results.txt" ]; then
    printf '\n== %s, alternating revisions\n' "$PAGELLM_AB_KERNEL_BENCH"
    sed 's/^/  /' "$dir/kernel-results.txt"
  fi
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) run ;;
  *) echo "usage: $0 pack REV... | $0 run" >&2; exit 2 ;;
esac
