#!/usr/bin/env bash
# Fetches xgrammar's source distribution from PyPI (Apache-2.0; its C++ core is the grammar
# engine of structured outputs, src/runtime/grammar.h) into third_party/xgrammar-<version>, whose
# C++ sources cmake/xgrammar.cmake builds into the project. Pinned by version and checksum;
# idempotent. scripts/patches/xgrammar-<version>-*.patch are applied after unpacking: fixes of
# bugs found here, each saying what it fixes.
#   scripts/fetch-xgrammar.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.2.8
SDIST="xgrammar-$VERSION.tar.gz"
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
dest="third_party/xgrammar-$VERSION"

patches=(scripts/patches/xgrammar-"$VERSION"-*.patch)
# The stamp names the archive and the patches, so a new patch re-applies everything.
stamp="$SHA256 $(cat "${patches[@]}" | sha256sum | cut -d' ' -f1)"
if [ -f "$dest/.fetched" ] && [ "$(cat "$dest/.fetched")" = "$stamp" ]; then
  echo "fetch-xgrammar: $dest is present"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The index's JSON API (PEP 691) names the file's URL; pip would try to build the sdist.
index="${PIP_INDEX_URL:-https://pypi.org/simple}"
url=$(python3 - "$index" "$SDIST" <<'PY'
import json, sys, urllib.request
index, name = sys.argv[1].rstrip("/"), sys.argv[2]
req = urllib.request.Request(f"{index}/xgrammar/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=120) as r:
    files = json.load(r)["files"]
print(next(f["url"] for f in files if f["filename"] == name))
PY
)
echo "fetch-xgrammar: downloading $SDIST"
python3 - "$url" "$tmp/$SDIST" <<'PY'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)
PY
if ! echo "$SHA256  $tmp/$SDIST" | sha256sum -c --status; then
  echo "fetch-xgrammar: checksum mismatch for $SDIST (expected $SHA256)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p third_party
tar -xzf "$tmp/$SDIST" -C third_party
for p in "${patches[@]}"; do
  patch -s -p1 -d "$dest" <"$p"
done
echo "$stamp" >"$dest/.fetched"
echo "fetch-xgrammar: $dest"
