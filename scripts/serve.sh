#!/usr/bin/env bash
# The main job in one command: install what is needed (scripts/setup.sh: Debian packages, the
# default model), build pagellm, and start the OpenAI-compatible server on the default model
# (SmolLM2-135M-Instruct on the CPU) at http://127.0.0.1:8000. Arguments go to `pagellm serve`,
# e.g. scripts/serve.sh --port 9000, or --model DIR --device cuda (configure with --preset cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset cpu -G Ninja >/dev/null
cmake --build build/cpu -j "$(nproc)" --target pagellm
exec build/cpu/tools/pagellm serve "$@"
