#!/usr/bin/env bash
# The machine code (SASS) of every CUDA kernel, another revision's build against the sources':
# a change meant to leave a kernel alone can be checked here without a GPU, and a decode that got
# slower between two revisions narrowed to the kernels whose code moved (docs/perf-history, thirty-first
# round: the streamed chain's, found this way).
#
#   PAGELLM_PREBUILD_REVS=<rev> PAGELLM_PREBUILD_TESTS=0 scripts/gpu-prebuild.sh   # builds <rev>
#   scripts/sass-diff.sh <rev> [NAME ...]    e.g. scripts/sass-diff.sh 71d643b gemv_stream
#
# NAME picks object files (gemv_stream for gemv_stream.cu.o; default all of the CUDA backend's).
# One line per kernel whose code differs: its instructions in <rev> and in the sources, the lines
# that differ as they are, and those that still differ with register numbers and constants
# masked ("shape": the same instructions in the same order, allocated or addressed otherwise).
# The code of PAGELLM_CUDA_ARCH (default 90a) in PAGELLM_BUILD_DIR (default build/cuda-dev), as in
# gpu-prebuild.sh. cuobjdump and nvdisasm come from their PyPI wheels (pinned below) into
# build/tools.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/sass-diff.sh <rev> [NAME ...]}
shift
sha=$(git rev-parse --short=7 "$rev")
old_dir=build/rev/$sha/build/src/CMakeFiles/pagellm_backend_cuda.dir/backend/cuda
arch=sm_${PAGELLM_CUDA_ARCH:-90a}
# The builds scripts/gpu-prebuild.sh makes, the ones a GPU run carries.
new_dir=${PAGELLM_BUILD_DIR:-build/cuda-dev}/src/CMakeFiles/pagellm_backend_cuda.dir/backend/cuda
[ -d "$old_dir" ] || { echo "sass-diff: no build of $sha: run PAGELLM_PREBUILD_REVS=$sha scripts/gpu-prebuild.sh" >&2; exit 1; }
[ -d "$new_dir" ] || { echo "sass-diff: no build of the sources: run scripts/gpu-prebuild.sh" >&2; exit 1; }

tools=build/tools/cuda-binutils
cuda_tools_version=13.2.51
if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$tools"
  python3 -m pip download --quiet --no-deps --dest "$tools/wheels" \
    "nvidia-cuda-cuobjdump==$cuda_tools_version" "nvidia-cuda-nvdisasm==$cuda_tools_version"
  for w in "$tools"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
  chmod +x "$tools"/nvidia/cu13/bin/*
fi
export PATH="$PWD/$tools/nvidia/cu13/bin:$PATH"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for o in "$new_dir"/*.cu.o; do names+=("$(basename "$o" .cu.o)"); done
fi
for n in "${names[@]}"; do
  old=$old_dir/$n.cu.o new=$new_dir/$n.cu.o
  if [ ! -f "$old" ] || [ ! -f "$new" ]; then
    echo "== $n: only in $([ -f "$old" ] && echo "$sha" || echo the sources)"
    continue
  fi
  python3 - "$n" "$sha" <(cuobjdump -arch "$arch" -sass "$old") \
    <(cuobjdump -arch "$arch" -sass "$new") <<'EOF'
import difflib, re, subprocess, sys

name, sha, old_path, new_path = sys.argv[1:5]

def demangled(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), text=True,
                         capture_output=True).stdout.splitlines()
    return [re.sub(r"^void |pagellm::cuda::|\(anonymous namespace\)::", "", n) for n in out]

def kernels(path):
    """{kernel's demangled name: [instruction, ...]}, addresses and scheduling comments dropped
    (the mangled name holds a per-tree hash of an anonymous namespace; the demangled one not)."""
    out, cur = {}, None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            out[cur].append(m.group(1))
    return dict(zip(demangled(list(out)), out.values()))

def shape(ins):
    return [re.sub(r"\bU?R\d+\b|\bU?P\d\b|\bB\d+\b|0x[0-9a-f]+", "_", i) for i in ins]

def differing(a, b):
    """Instructions of the longer listing that the other has not in the same order."""
    matched = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return max(len(a), len(b)) - sum(m.size for m in matched)

def base(n):
    """A kernel's name without its template arguments and parameters."""
    return re.sub(r"<.*", "", re.sub(r"\(.*", "", n))

def compared(a, b):
    return "%d -> %d instructions, %d lines differ, %d in shape" % (
        len(a), len(b), differing(a, b), differing(shape(a), shape(b)))

old, new = kernels(old_path), kernels(new_path)
same, rows = 0, []
for k in sorted(set(old) & set(new)):
    if old[k] == new[k]:
        same += 1
    else:
        rows.append("  %s: %s" % (k, compared(old[k], new[k])))
# A kernel renamed (its parameters or template arguments changed) is compared with every kernel
# of its base name that only the sources have.
only_new = [k for k in new if k not in old]
only_old = [k for k in old if k not in new]
for k in sorted(only_old):
    peers = [n for n in only_new if base(n) == base(k)]
    if not peers:
        rows.append("  only in %s: %s (%d instructions)" % (sha, k, len(old[k])))
    for n in sorted(peers):
        rows.append("  %s -> %s: %s" % (k, n, compared(old[k], new[n])))
for n in sorted(only_new):
    if not any(base(k) == base(n) for k in only_old):
        rows.append("  only in the sources: %s (%d instructions)" % (n, len(new[n])))
print("== %s: %d kernels identical%s" % (name, same, ", these not:" if rows else ""))
for r in rows:
    print(r)
EOF
done
