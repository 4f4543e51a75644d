#!/usr/bin/env bash
# Registers, spills and static shared memory of every kernel in the given CUDA sources (default:
# all of src/backend/cuda), as ptxas reports them for the target: a kernel change can be reviewed
# here, without a GPU, before a run (a new spill, or registers that cut the blocks an SM holds).
#
#   scripts/cuda-resources.sh [FILE.cu ...]      e.g. scripts/cuda-resources.sh src/backend/cuda/moe.cu
#
# One line per kernel instance: registers, spill stores / loads (bytes), stack frame and static
# shared memory (bytes), the demangled name less the project's namespaces. Environment:
# PAGELLM_CUDA_ARCH (default 90a); NVCC (default: nvcc on the PATH, else the toolkit's).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${PAGELLM_CUDA_ARCH:-90a}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(src/backend/cuda/*.cu)
for f in "${files[@]}"; do
  echo "== $f"
  "$nvcc" -std=c++17 -O3 -DNDEBUG -DPAGELLM_HAVE_CUDA=1 -Isrc -Iinclude \
    "--generate-code=arch=compute_$arch,code=sm_$arch" -x cu -c "$f" -o /dev/null -Xptxas -v 2>&1 |
    python3 -c '
import re, subprocess, sys
rows, name, frame = [], None, {}
for line in sys.stdin:
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        name, frame = m.group(1), {}
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        frame = dict(zip(("stack", "st", "ld"), m.groups()))
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        smem = re.search(r"(\d+) bytes smem", line)
        rows.append((name, m.group(1), frame.get("st", "0"), frame.get("ld", "0"),
                     frame.get("stack", "0"), smem.group(1) if smem else "0"))
        name = None
    elif re.search(r"error", line):
        sys.stdout.write(line)
if rows:
    names = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows), text=True,
                           capture_output=True).stdout.splitlines()
    print("%5s %11s %6s %6s  kernel" % ("regs", "spill st/ld", "stack", "smem"))
    names = [re.sub(r"^void |pagellm::cuda::|\(anonymous namespace\)::", "", n) for n in names]
    for r, n in sorted(zip(rows, names), key=lambda x: x[1]):
        print("%5s %11s %6s %6s  %s" % (r[1], r[2] + "/" + r[3], r[4], r[5], n))
'
done
